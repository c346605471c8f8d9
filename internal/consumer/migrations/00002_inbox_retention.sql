-- +goose Up

-- The inbox need not remember a webhook-id forever, only for as long as the
-- sender may send it again: its retries (the order service's span 27.6 h)
-- and its replays (of events it keeps for OUTBOX_RETENTION, 7 days). Older
-- rows are pruned (Consumer.PruneInbox, CONSUMER_INBOX_RETENTION), so the
-- ledger, which is kept, no longer references them.
ALTER TABLE consumer_ledger DROP CONSTRAINT consumer_ledger_webhook_id_fkey;
CREATE INDEX consumer_inbox_received ON consumer_inbox (received_at);

-- +goose Down
DROP INDEX consumer_inbox_received;
ALTER TABLE consumer_ledger ADD CONSTRAINT consumer_ledger_webhook_id_fkey
    FOREIGN KEY (webhook_id) REFERENCES consumer_inbox (webhook_id);

-- +goose Up

-- Messages failed at the attempt cap by a release (a dead relay's claims,
-- MessagesReleaseLost, or a stale claim, MessageReleaseStale) were written
-- without failed_at, so the failed retention (MessagesPruneFailed walks
-- failed_at) never pruned them. The releases now set it; the rows already
-- written get the time of their last attempt.
UPDATE outbox_messages m
SET failed_at = COALESCE((SELECT max(a.finished_at) FROM outbox_attempts a WHERE a.message_id = m.id), m.next_attempt_at)
WHERE m.status = 'failed' AND m.failed_at IS NULL;

-- +goose Down
SELECT 1;

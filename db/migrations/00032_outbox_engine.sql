-- +goose Up

-- Per-key order, defined once. A keyed message may be sent only when no
-- message of its destination and key is in flight (claimed) and none
-- before it is unfinished. outbox_key_ahead returns the messages that
-- stand ahead of message @before in destination @dest and key @key: the
-- claimed ones, and the earlier ones still pending after an attempt or a
-- requeue, parked, or failed. Every statement that needs the rule calls
-- it (the claim, the promotion, the ops page's "waits for"); it is a SQL
-- function of one SELECT, so PostgreSQL inlines it into the calling
-- statement and answers it with one probe of outbox_messages_ordering_idx,
-- whose predicate it repeats word for word: a test explains the claim and
-- fails if that index stops being used.
--
-- A pending message that was never tried (attempts = 0, attempts_before =
-- 0, not parked) is not in the index and not returned: the order
-- transaction never maintains the index. Such a message is due at its
-- event's time (EventEnqueue, and EndpointReplay for a replayed copy), so
-- the claim, which reads due messages oldest due first, meets it before
-- any later message of its key and holds the later one back itself.
CREATE FUNCTION outbox_key_ahead(dest uuid, key text, before uuid)
RETURNS TABLE (id uuid, status text)
LANGUAGE sql STABLE
AS $$
    SELECT b.id, b.status FROM outbox_messages b
    WHERE b.destination = dest AND b.ordering_key = key
      AND ((b.status = ANY (ARRAY['claimed'::text, 'failed'::text]))
           OR (b.status = 'pending'::text AND (b.attempts > 0 OR b.attempts_before > 0 OR b.parked)))
      AND (b.status = 'claimed' OR b.id < before)
$$;

-- Before this rule, the relay swept parked messages left with nothing
-- ahead of them (a claim racing a skip could strand one); now every change
-- that lets a key go on promotes it at once. A database upgraded with such
-- a message stranded gets it promoted here, once.
UPDATE outbox_messages m SET parked = false
WHERE m.id IN (
    SELECT DISTINCT ON (w.destination, w.ordering_key) w.id
    FROM outbox_messages w
    WHERE w.ordering_key IS NOT NULL AND w.status = 'pending' AND w.parked
    ORDER BY w.destination, w.ordering_key, w.id
)
AND NOT EXISTS (SELECT 1 FROM outbox_key_ahead(m.destination, m.ordering_key, m.id));

-- The relay's pace for the endpoint: how many requests it lets itself
-- have in flight to it, adapted as the receiver answers (grown while
-- requests succeed, halved when the receiver says it is full), kept
-- between deliver jobs. NULL: not known yet (a new endpoint, or one coming
-- back from an outage), so the relay starts low.
ALTER TABLE webhook_endpoints ADD COLUMN pace integer CHECK (pace > 0);

-- +goose Down
ALTER TABLE webhook_endpoints DROP COLUMN pace;
DROP FUNCTION outbox_key_ahead(uuid, text, uuid);

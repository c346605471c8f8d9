-- Per-key order, and the lease's fence. The rule, in one place
-- (outbox_key_ahead): a keyed
-- message is sent only when nothing of its destination and key is in
-- flight and nothing before it is unfinished. The claim parks a due
-- message that must wait (MessageClaim); whatever lets a key go on
-- (an outcome recorded, a claim released, a failed message skipped or
-- pruned) promotes the key's first parked message (MessagesPromote). Both
-- run under the destination's lock (DestinationLock), taken in a statement
-- of its own before theirs, so they run one at a time per destination and
-- each sees what the previous one committed: a promotion never misses a
-- message a claim parked, and a claim never parks a message behind one a
-- promotion already let go.

-- name: DestinationLock :exec
-- Takes the destination's lock until the transaction (or the pgx batch,
-- which is one) ends. Every transaction that changes what a destination's
-- claims may take takes it first: claims, promotions, takeovers of its
-- lease, its deletion. Its own statement, so the next one's snapshot is
-- taken with the lock held. Transaction-scoped advisory locks in the
-- two-integer space, apart from River's and from the other outbox locks
-- (1869574763-1869574765).
SELECT pg_advisory_xact_lock(1869574766, hashtext(CAST(@destination::uuid AS text)));

-- name: TransactionPlanGeneric :exec
-- Makes the statements after it in the same transaction (or the same pgx
-- batch, which is one) run under a generic plan, planned once per
-- connection instead of at every call; see MessageClaim.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: MessageClaim :many
-- Claims up to @batch_size of one destination's due messages, oldest due
-- first, for the deliver job holding the destination's lease, in ONE
-- statement, under the destination's lock (DestinationLock). The job sends
-- what it claims at once, so a claim's age is the age of its request. SKIP
-- LOCKED keeps the claim from waiting on a deletion's discard. Each row
-- comes with its event (payload, trace context) and the endpoint's URL and
-- secrets as they are now, so a rotated secret takes effect at the next
-- claim. The attempt is counted when its outcome is recorded, not here.
--
-- The lease is fenced by the destination's lock: a takeover
-- (DestinationLease) and a deletion take it too, so a claim either ends
-- before them, or reads the endpoint after they committed and finds its
-- token gone: a job whose lease was taken over (its relay declared dead
-- while it still ran) claims nothing, however late its statement runs.
--
-- Per-key order: a due keyed message is claimed only when it is the first
-- of its key among the due ones read here (fresh messages, which the rule
-- does not see, are due at their event's time, so they are read in their
-- key's order) and nothing stands ahead of it (outbox_key_ahead); else it
-- is parked: out of the pending index, so out of every later claim's way,
-- until a promotion lets it go (MessagesPromote).
--
-- One update both claims and parks: each update of a partitioned table
-- sets up every partition as the statement starts, whatever it then
-- touches, and with a dozen partitions that setup is most of a small
-- claim's cost (a second update for the parked cost one order fanned out
-- to 10,000 endpoints about 7 % more time). The claimed rows' events are
-- joined after it: a kept message always has its event (EventsPrune keeps
-- an event while any of its messages is kept).
--
-- Run under a generic plan (TransactionPlanGeneric): planned per call,
-- this statement takes about as long to plan as to run, and PostgreSQL
-- keeps planning it because it misjudges the generic plan's cost. The
-- update finds its rows by = ANY (ARRAY(...)) so the generic plan reads
-- them on the primary key, as a custom plan does, and between the least
-- and the greatest of those ids: an array known only at run time prunes no
-- partition, a range does (from the subqueries, before the scans start), so
-- the update probes the partitions its rows are in, not the primary key of
-- every retained day for each of its rows.
WITH lease AS (
    SELECT e.url, e.secret,
           COALESCE(CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END, '')::text AS previous_secret
    FROM webhook_endpoints e
    WHERE e.id = @destination::uuid AND e.lease_token = @claim_token::uuid AND e.enabled
), due AS (
    SELECT p.id, p.ordering_key FROM outbox_messages p
    WHERE p.destination = @destination::uuid AND p.status = 'pending' AND NOT p.parked AND p.next_attempt_at <= now()
      AND EXISTS (SELECT 1 FROM lease)
    ORDER BY p.next_attempt_at, p.id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
), judged AS (
    SELECT d.id,
           d.ordering_key IS NOT NULL AND (
               row_number() OVER (PARTITION BY d.ordering_key ORDER BY d.id) > 1
               OR EXISTS (SELECT 1 FROM outbox_key_ahead(@destination::uuid, d.ordering_key, d.id))
           ) AS behind
    FROM due d
), claimed AS (
    UPDATE outbox_messages m
    SET parked = j.behind,
        status = CASE WHEN j.behind THEN m.status ELSE 'claimed' END,
        claim_token = CASE WHEN j.behind THEN m.claim_token ELSE @claim_token::uuid END,
        claimed_by = CASE WHEN j.behind THEN m.claimed_by ELSE @relay_id::uuid END,
        claimed_at = CASE WHEN j.behind THEN m.claimed_at ELSE now() END
    FROM judged j
    WHERE m.id = j.id AND m.id = ANY (ARRAY(SELECT j.id FROM judged j))
      AND m.id >= (SELECT j.id FROM judged j ORDER BY j.id LIMIT 1)
      AND m.id <= (SELECT j.id FROM judged j ORDER BY j.id DESC LIMIT 1)
    RETURNING m.id, m.event_id, m.type, m.attempts, m.ordering_key, j.behind
)
SELECT c.id, c.event_id, c.type, ev.payload, c.attempts, ev.created_at, ev.trace_context, c.ordering_key,
       lease.url AS endpoint_url, lease.secret AS endpoint_secret, lease.previous_secret AS endpoint_previous_secret
FROM claimed c
JOIN outbox_events ev ON ev.id = c.event_id
CROSS JOIN lease
WHERE NOT c.behind;

-- name: MessagesPromote :execrows
-- Lets each of @keys of the destination go on: its first parked message is
-- due again (at its own time) if nothing stands ahead of it any more
-- (outbox_key_ahead). Run, under the destination's lock, by everything that
-- lets a key go on: a recorded outcome or a released claim (the message is
-- no longer in flight: a replayed event parked behind it goes next, and
-- after a delivery the next of the key), a skipped or pruned failed
-- message. Only the first parked message can be the next: every later one
-- has it ahead. Promoting one that must still wait (behind a message never
-- tried, which the rule does not see) is harmless: the next claim parks it
-- again. One probe of outbox_messages_ordering_idx per key.
UPDATE outbox_messages m
SET parked = false
WHERE m.id IN (
    SELECT f.id
    FROM unnest(@keys::text[]) AS k (key)
    CROSS JOIN LATERAL (
        SELECT w.id FROM outbox_messages w
        WHERE w.destination = @destination::uuid AND w.ordering_key = k.key
          AND w.status = 'pending' AND w.parked
        ORDER BY w.id
        LIMIT 1
    ) f
)
AND NOT EXISTS (SELECT 1 FROM outbox_key_ahead(m.destination, m.ordering_key, m.id));

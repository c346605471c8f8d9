-- +goose Up

-- Every event looks up the endpoints subscribed to its type (EventEnqueue,
-- EventNotify). Without an index that was a scan of every endpoint and a
-- search of each one's types, in the order's transaction: its cost grew
-- with the number of endpoints, whatever they subscribe to (the lab's
-- bench measures the write path beside 1,000 endpoints of other
-- types). The queries ask for `event_types @> ARRAY[type]`, which
-- this index answers; with a handful of endpoints the planner still reads
-- the table, which is cheaper then.
-- fastupdate off: endpoints are written rarely and read on every event, and
-- GIN's pending list (where fastupdate puts new entries until a vacuum)
-- would be read linearly by every lookup; the planner, counting it, chose
-- to read the whole table instead.
CREATE INDEX webhook_endpoints_event_types_idx ON webhook_endpoints USING gin (event_types) WITH (fastupdate = off);

-- +goose Down
DROP INDEX webhook_endpoints_event_types_idx;

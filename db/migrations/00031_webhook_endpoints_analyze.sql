-- +goose Up

-- The write path finds an event's subscribers in webhook_endpoints, on every
-- order. A table PostgreSQL has never analyzed is planned as if it had 10
-- pages, and autovacuum analyzes a table only after 50 rows changed, which
-- the handful of endpoints of a new deployment never reaches: the api's
-- cached plan then set up a bitmap scan of the GIN index
-- (webhook_endpoints_event_types_idx) for each order, where reading a page
-- or two costs less. Once analyzed, even empty, the planner scales its
-- estimate with the table's pages as it grows: it reads the pages while the
-- endpoints are a couple of hundred at most, and takes the index beyond.
ANALYZE webhook_endpoints;

-- +goose Down
SELECT 1;

-- +goose Up

-- A rotation remembers when it was made, with which overlap and under
-- which Idempotency-Key (NULL when the request carried none): the request
-- sent again with the key (its answer was lost) gets this rotation and its
-- secret, instead of a second rotation that would show a secret nobody saw
-- and cut the overlap of the one the receivers use.
ALTER TABLE webhook_endpoints
    ADD COLUMN secret_rotated_at       timestamptz,
    ADD COLUMN secret_rotation_overlap interval,
    ADD COLUMN secret_rotation_key     text;

-- +goose Down
ALTER TABLE webhook_endpoints
    DROP COLUMN secret_rotated_at,
    DROP COLUMN secret_rotation_overlap,
    DROP COLUMN secret_rotation_key;

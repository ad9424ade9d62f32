-- Bindings of a mesh: node records, mesh settings, and per-node assignments,
-- overrides and grants. Every change to any of them bumps the single mesh
-- revision once per transaction and notifies channel meshbox_bindings with
-- the new revision, from triggers, so no writer can forget.

CREATE TABLE mesh_revision (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revision   bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT now(),
    last_xact  xid8
);
INSERT INTO mesh_revision DEFAULT VALUES;

CREATE TABLE mesh_info (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    first_node text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    public_name text NOT NULL DEFAULT '',
    identity    text NOT NULL DEFAULT ''
);

CREATE TABLE settings (
    key   text PRIMARY KEY CHECK (key ~ '^[a-z0-9][a-z0-9_.-]{0,127}$'),
    value text NOT NULL
);

CREATE TABLE assignments (
    node      text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    module    text NOT NULL CHECK (module ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    selection text NOT NULL DEFAULT '',
    autostart boolean NOT NULL DEFAULT false,
    PRIMARY KEY (node, module)
);

CREATE TABLE overrides (
    node   text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    module text NOT NULL CHECK (module ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    key    text NOT NULL CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    value  text NOT NULL,
    PRIMARY KEY (node, module, key)
);

CREATE TABLE grants (
    consumer   text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    resource   text NOT NULL,
    provider   text NOT NULL,
    credential text NOT NULL DEFAULT '',
    PRIMARY KEY (consumer, resource, provider)
);

-- meshbox_bump_revision bumps the revision at most once per transaction:
-- a second change in the same transaction finds last_xact equal to its own
-- and leaves the row alone. Concurrent writers serialize on the row lock.
CREATE FUNCTION meshbox_bump_revision() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    rev bigint;
BEGIN
    UPDATE mesh_revision
       SET revision = revision + 1, changed_at = now(), last_xact = pg_current_xact_id()
     WHERE last_xact IS DISTINCT FROM pg_current_xact_id()
    RETURNING revision INTO rev;
    IF FOUND THEN
        PERFORM pg_notify('meshbox_bindings', rev::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER nodes_bump AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER nodes_bump_update AFTER UPDATE ON nodes
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER nodes_bump_truncate AFTER TRUNCATE ON nodes
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

CREATE TRIGGER settings_bump AFTER INSERT OR DELETE ON settings
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER settings_bump_update AFTER UPDATE ON settings
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER settings_bump_truncate AFTER TRUNCATE ON settings
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

CREATE TRIGGER assignments_bump AFTER INSERT OR DELETE ON assignments
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER assignments_bump_update AFTER UPDATE ON assignments
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER assignments_bump_truncate AFTER TRUNCATE ON assignments
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

CREATE TRIGGER overrides_bump AFTER INSERT OR DELETE ON overrides
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER overrides_bump_update AFTER UPDATE ON overrides
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER overrides_bump_truncate AFTER TRUNCATE ON overrides
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

CREATE TRIGGER grants_bump AFTER INSERT OR DELETE ON grants
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER grants_bump_update AFTER UPDATE ON grants
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER grants_bump_truncate AFTER TRUNCATE ON grants
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

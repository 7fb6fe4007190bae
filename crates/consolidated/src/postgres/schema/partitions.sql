-- Partitioned tables, tracked at the partition level (see partitions.rs). Installed by
-- the first `init` of a partitioned table; the event triggers need a superuser. The
-- functions run as their owner, with init's search_path, so that whoever creates,
-- detaches or drops a partition need not own rowsync's tables.
CREATE TABLE IF NOT EXISTS rs_partition (
    relation oid PRIMARY KEY,
    table_name TEXT NOT NULL
);

-- Brings rs_partition in step with the partitions `tracked` has now: a new partition
-- gets the statement triggers PostgreSQL does not clone (deletes aimed at it,
-- TRUNCATE), and its rows a new stamp when `attached` (rows that were not the table's
-- reach the devices); a partition detached leaves tombstones for its rows.
CREATE OR REPLACE FUNCTION rs_partitions_follow(tracked TEXT, attached BOOLEAN) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $rs$
DECLARE
    parent regclass := to_regclass(quote_ident(tracked));
    member oid;
BEGIN
    FOR member IN SELECT relid FROM pg_partition_tree(parent) WHERE relid <> parent
                  EXCEPT SELECT relation FROM rs_partition WHERE table_name = tracked LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER %1$I AFTER DELETE ON %2$s
            REFERENCING OLD TABLE AS rs_old FOR EACH STATEMENT EXECUTE FUNCTION %3$I()',
            'rs_delete_' || tracked, member::regclass, 'rs_track_delete_' || tracked);
        EXECUTE format('CREATE OR REPLACE TRIGGER %1$I BEFORE TRUNCATE ON %2$s
            FOR EACH STATEMENT EXECUTE FUNCTION rs_track_truncate(%3$L)',
            'rs_truncate_' || tracked, member::regclass, tracked);
        IF attached THEN
            EXECUTE format('UPDATE ONLY %s SET rs_xid = (pg_current_xact_id()::text)::bigint',
                member::regclass);
        END IF;
        INSERT INTO rs_partition (relation, table_name) VALUES (member, tracked);
    END LOOP;
    FOR member IN SELECT relation FROM rs_partition WHERE table_name = tracked
                  EXCEPT SELECT relid FROM pg_partition_tree(parent) LOOP
        IF EXISTS (SELECT 1 FROM pg_class WHERE oid = member) THEN
            PERFORM rs_track_gone(tracked, member);
            EXECUTE format('DROP TRIGGER IF EXISTS %1$I ON %2$s; DROP TRIGGER IF EXISTS %3$I ON %2$s',
                'rs_delete_' || tracked, member::regclass, 'rs_truncate_' || tracked);
        END IF;
        DELETE FROM rs_partition WHERE relation = member;
    END LOOP;
END $rs$;

-- After CREATE TABLE and ALTER TABLE: partitions created, attached or detached.
CREATE OR REPLACE FUNCTION rs_partitions_changed() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $rs$
DECLARE
    tracked TEXT;
BEGIN
    -- `init` sets rowsync.initializing: it follows the table's partitions itself, once
    -- its own DDL is done (and does not stamp their rows again).
    IF to_regclass('rs_partition') IS NULL OR to_regclass('rs_table') IS NULL
       OR current_setting('rowsync.initializing', true) = 'on' THEN
        RETURN;
    END IF;
    FOR tracked IN SELECT t.table_name FROM rs_table AS t
                   JOIN pg_class AS c ON c.oid = to_regclass(quote_ident(t.table_name))
                   WHERE c.relkind = 'p' LOOP
        PERFORM rs_partitions_follow(tracked, true);
    END LOOP;
END $rs$;

-- Before DROP TABLE (ddl_command_start): a partition the statement names leaves
-- tombstones for its rows while they can still be read (a name matched too widely only
-- costs tombstones of keys still present, which the delete cursor leaves out). After
-- any drop (sql_drop): a partition of a table still synchronized whose rows left none
-- (its name was not in the statement: DROP SCHEMA, dynamic SQL) is refused.
CREATE OR REPLACE FUNCTION rs_partitions_drop() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $rs$
DECLARE
    member RECORD;
BEGIN
    IF to_regclass('rs_partition') IS NULL THEN
        RETURN;
    END IF;
    IF TG_EVENT = 'ddl_command_start' THEN
        -- (Each name read by its oid: a join would scan pg_class at every DROP TABLE,
        -- a sync's staging tables' too.)
        FOR member IN SELECT p.relation, p.table_name FROM rs_partition AS p
                      WHERE position(lower((SELECT c.relname FROM pg_class AS c WHERE c.oid = p.relation))
                                     IN lower(current_query())) > 0 LOOP
            PERFORM rs_track_gone(member.table_name, member.relation);
            PERFORM set_config('rowsync.partitions_dropping', concat_ws(',',
                nullif(current_setting('rowsync.partitions_dropping', true), ''),
                member.relation::text), true);
        END LOOP;
        RETURN;
    END IF;
    FOR member IN SELECT p.relation, p.table_name, d.object_identity
                  FROM pg_event_trigger_dropped_objects() AS d
                  JOIN rs_partition AS p ON p.relation = d.objid
                  WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 LOOP
        IF to_regclass(quote_ident(member.table_name)) IS NOT NULL AND NOT member.relation::text
           = ANY (string_to_array(coalesce(current_setting('rowsync.partitions_dropping', true), ''), ',')) THEN
            RAISE EXCEPTION 'rowsync: % is a partition of the synchronized table %, and its rows would leave no tombstones', member.object_identity, member.table_name
                USING HINT = format('detach it first (ALTER TABLE %I DETACH PARTITION %s), then drop it; or drop it by name in a DROP TABLE statement of its own', member.table_name, member.object_identity);
        END IF;
        DELETE FROM rs_partition WHERE relation = member.relation;
    END LOOP;
END $rs$;

DO $rs$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'rs_partitions_changed') THEN
        CREATE EVENT TRIGGER rs_partitions_changed ON ddl_command_end
            WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE') EXECUTE FUNCTION rs_partitions_changed();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'rs_partitions_dropping') THEN
        CREATE EVENT TRIGGER rs_partitions_dropping ON ddl_command_start
            WHEN TAG IN ('DROP TABLE') EXECUTE FUNCTION rs_partitions_drop();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'rs_partitions_dropped') THEN
        CREATE EVENT TRIGGER rs_partitions_dropped ON sql_drop
            EXECUTE FUNCTION rs_partitions_drop();
    END IF;
END $rs$;

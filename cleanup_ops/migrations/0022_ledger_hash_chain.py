"""The ledger's hash chains (``cleanup_ops.ledger_chain``, whose docstring states the protocol).

Adds each chained row's ``prev_id``, ``prev_hash`` and ``entry_hash``, the
chain-head table, the database functions that hash a row and link it to its
chain as it is inserted (a ``BEFORE INSERT`` trigger on ``LedgerEntry`` and on
``TablePartitionDrop``), and backfills the rows written before, chain by
chain in id order (``cleanup_ops_ledger_chain_backfill``). The whole
migration is one transaction: adding the columns locks both tables, so no
batch writes a row between the backfill and the trigger. On a fresh database
the backfill finds nothing.
"""

from django.db import migrations, models

# The canonical text of a row: each part as <length>:<text>; (NULL as -;), so
# no two lists of parts spell the same text. Times as UTC with microseconds.
FUNCTIONS = r"""
CREATE FUNCTION cleanup_ops_chain_text(parts text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(string_agg(coalesce(length(u.p)::text || ':' || u.p, '-') || ';', '' ORDER BY u.n), '')
  FROM unnest(parts) WITH ORDINALITY AS u(p, n)
$$;

CREATE FUNCTION cleanup_ops_chain_time(t timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

CREATE FUNCTION cleanup_ops_ledger_entry_hash(e cleanup_ops_ledgerentry) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT encode(sha256(convert_to(cleanup_ops_chain_text(ARRAY[
    'ledger-entry-v1', e.id::text, e.prev_id::text, e.prev_hash, e.operation_id, e.job_id::text,
    e.portfolio_id::text, e.property_id::text, e.record_kind, e.policy_version_id::text,
    cleanup_ops_chain_time(e.cutoff), e.after_id::text, e.last_id::text, e.after_key, e.last_key,
    e.batch_limit::text, e.candidates::text, e.rows_deleted::text, e.rows_held::text,
    cleanup_ops_chain_time(e.applied_at)]), 'UTF8')), 'hex')
$$;

CREATE FUNCTION cleanup_ops_table_partition_drop_hash(d cleanup_ops_tablepartitiondrop) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT encode(sha256(convert_to(cleanup_ops_chain_text(ARRAY[
    'table-partition-drop-v1', d.id::text, d.prev_id::text, d.prev_hash, d.operation_id, d.sweep_id::text,
    d.record_kind, d."table", d.table_partition, cleanup_ops_chain_time(d.lower_bound),
    cleanup_ops_chain_time(d.upper_bound), d."rows"::text, d.ids_digest, d.portfolios::text,
    cleanup_ops_chain_time(d.slot), cleanup_ops_chain_time(d.dropped_at)]), 'UTF8')), 'hex')
$$;

-- The chain's head, locked FOR UPDATE until the transaction ends (created
-- the first time; a second creator waits for the first, then locks its row).
CREATE FUNCTION cleanup_ops_chain_head_lock(key text) RETURNS cleanup_ops_ledgerchainhead
LANGUAGE plpgsql AS $$
DECLARE
  h cleanup_ops_ledgerchainhead;
BEGIN
  SELECT * INTO h FROM cleanup_ops_ledgerchainhead WHERE chain = key FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO cleanup_ops_ledgerchainhead (chain, entry_id, entry_hash, entries)
    VALUES (key, 0, '', 0) ON CONFLICT (chain) DO NOTHING;
    SELECT * INTO h FROM cleanup_ops_ledgerchainhead WHERE chain = key FOR UPDATE;
  END IF;
  RETURN h;
END
$$;

CREATE FUNCTION cleanup_ops_chain_head_move(key text, id bigint, hash text) RETURNS void
LANGUAGE sql AS $$
  UPDATE cleanup_ops_ledgerchainhead SET entry_id = id, entry_hash = hash, entries = entries + 1 WHERE chain = key
$$;

-- A row inserted links to its chain's head, under the head's lock. Its id is
-- drawn again under that lock when the sequence gave it before a concurrent
-- writer's row that linked first, so a chain's rows are in id order.
CREATE FUNCTION cleanup_ops_ledger_entry_link() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  key text := 'portfolio:' || NEW.portfolio_id;
  h cleanup_ops_ledgerchainhead := cleanup_ops_chain_head_lock(key);
BEGIN
  IF NEW.id <= h.entry_id THEN
    NEW.id := nextval(pg_get_serial_sequence('cleanup_ops_ledgerentry', 'id'));
  END IF;
  NEW.prev_id := nullif(h.entry_id, 0);
  NEW.prev_hash := h.entry_hash;
  NEW.entry_hash := cleanup_ops_ledger_entry_hash(NEW);
  PERFORM cleanup_ops_chain_head_move(key, NEW.id, NEW.entry_hash);
  RETURN NEW;
END
$$;

CREATE FUNCTION cleanup_ops_table_partition_drop_link() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  key text := 'table_partitions';
  h cleanup_ops_ledgerchainhead := cleanup_ops_chain_head_lock(key);
BEGIN
  IF NEW.id <= h.entry_id THEN
    NEW.id := nextval(pg_get_serial_sequence('cleanup_ops_tablepartitiondrop', 'id'));
  END IF;
  NEW.prev_id := nullif(h.entry_id, 0);
  NEW.prev_hash := h.entry_hash;
  NEW.entry_hash := cleanup_ops_table_partition_drop_hash(NEW);
  PERFORM cleanup_ops_chain_head_move(key, NEW.id, NEW.entry_hash);
  RETURN NEW;
END
$$;

CREATE TRIGGER cleanup_ops_ledger_entry_link BEFORE INSERT ON cleanup_ops_ledgerentry
FOR EACH ROW EXECUTE FUNCTION cleanup_ops_ledger_entry_link();
CREATE TRIGGER cleanup_ops_table_partition_drop_link BEFORE INSERT ON cleanup_ops_tablepartitiondrop
FOR EACH ROW EXECUTE FUNCTION cleanup_ops_table_partition_drop_link();

-- The rows written before the chain: linked chain by chain in id order.
-- Returns the rows linked. Run alone (the migration's lock): it locks heads
-- in the rows' order, not in one order as the batches do.
CREATE FUNCTION cleanup_ops_ledger_chain_backfill() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  e cleanup_ops_ledgerentry;
  d cleanup_ops_tablepartitiondrop;
  h cleanup_ops_ledgerchainhead;
  key text;
  n bigint := 0;
BEGIN
  FOR e IN SELECT * FROM cleanup_ops_ledgerentry WHERE entry_hash IS NULL ORDER BY id LOOP
    key := 'portfolio:' || e.portfolio_id;
    h := cleanup_ops_chain_head_lock(key);
    IF e.id <= h.entry_id THEN
      RAISE EXCEPTION 'ledger row % is before its chain''s head % and cannot be linked', e.id, h.entry_id;
    END IF;
    e.prev_id := nullif(h.entry_id, 0);
    e.prev_hash := h.entry_hash;
    e.entry_hash := cleanup_ops_ledger_entry_hash(e);
    UPDATE cleanup_ops_ledgerentry SET prev_id = e.prev_id, prev_hash = e.prev_hash, entry_hash = e.entry_hash
    WHERE id = e.id;
    PERFORM cleanup_ops_chain_head_move(key, e.id, e.entry_hash);
    n := n + 1;
  END LOOP;
  FOR d IN SELECT * FROM cleanup_ops_tablepartitiondrop WHERE entry_hash IS NULL ORDER BY id LOOP
    key := 'table_partitions';
    h := cleanup_ops_chain_head_lock(key);
    IF d.id <= h.entry_id THEN
      RAISE EXCEPTION 'table partition drop % is before its chain''s head % and cannot be linked', d.id, h.entry_id;
    END IF;
    d.prev_id := nullif(h.entry_id, 0);
    d.prev_hash := h.entry_hash;
    d.entry_hash := cleanup_ops_table_partition_drop_hash(d);
    UPDATE cleanup_ops_tablepartitiondrop SET prev_id = d.prev_id, prev_hash = d.prev_hash, entry_hash = d.entry_hash
    WHERE id = d.id;
    PERFORM cleanup_ops_chain_head_move(key, d.id, d.entry_hash);
    n := n + 1;
  END LOOP;
  RETURN n;
END
$$;
"""

DROP_FUNCTIONS = """
DROP TRIGGER IF EXISTS cleanup_ops_ledger_entry_link ON cleanup_ops_ledgerentry;
DROP TRIGGER IF EXISTS cleanup_ops_table_partition_drop_link ON cleanup_ops_tablepartitiondrop;
DROP FUNCTION IF EXISTS cleanup_ops_ledger_chain_backfill();
DROP FUNCTION IF EXISTS cleanup_ops_ledger_entry_link();
DROP FUNCTION IF EXISTS cleanup_ops_table_partition_drop_link();
DROP FUNCTION IF EXISTS cleanup_ops_chain_head_move(text, bigint, text);
DROP FUNCTION IF EXISTS cleanup_ops_chain_head_lock(text);
DROP FUNCTION IF EXISTS cleanup_ops_ledger_entry_hash(cleanup_ops_ledgerentry);
DROP FUNCTION IF EXISTS cleanup_ops_table_partition_drop_hash(cleanup_ops_tablepartitiondrop);
DROP FUNCTION IF EXISTS cleanup_ops_chain_time(timestamptz);
DROP FUNCTION IF EXISTS cleanup_ops_chain_text(text[]);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0021_canonical_document_refs"),
    ]

    operations = [
        migrations.AddField(
            model_name="ledgerentry",
            name="prev_id",
            field=models.BigIntegerField(
                blank=True, help_text="The previous row of this portfolio's chain.", null=True
            ),
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="prev_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="entry_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="tablepartitiondrop",
            name="prev_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="tablepartitiondrop",
            name="prev_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="tablepartitiondrop",
            name="entry_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.CreateModel(
            name="LedgerChainHead",
            fields=[
                ("chain", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("entry_id", models.BigIntegerField(default=0, help_text="The last row's id; 0: no row yet.")),
                ("entry_hash", models.CharField(blank=True, default="", max_length=64)),
                ("entries", models.BigIntegerField(default=0, help_text="Rows linked so far.")),
            ],
            options={"ordering": ["chain"]},
        ),
        migrations.RunSQL(FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
        migrations.RunSQL("SELECT cleanup_ops_ledger_chain_backfill()", reverse_sql=migrations.RunSQL.noop),
    ]

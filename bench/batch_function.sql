-- The prototype of issue 40's "PL/pgSQL function per batch", installed by
-- bench/batch_function.py in the benchmark's own database only (never by a
-- migration): the product's batch protocol (cleanup_ops/execution/batches.py,
-- steps a-e) for one leased job, in one call, one round trip.
--
-- A template for psycopg.sql: every field in braces is filled by the bench.
-- The statements (the fence, the policy read, the ledger lookup, the DELETE,
-- the advance with or without the ledger row, the sweep's lock and finish)
-- are the product's own
-- (cleanup_ops.execution.statements, cleanup_ops.sweeps), their parameters
-- bound to this function's variables, so the shapes, locks and predicates
-- are those the client sends. Each runs as its own statement with its own
-- snapshot (a VOLATILE function under READ COMMITTED): the fence and scope
-- locks, then the policy read, then the DELETE, as in the product.
--
-- What it leaves out (the bench checks none is needed on its data): the
-- outbox (step f; it raises when a deleted row names a document), the
-- non-integer keys' text cursors, the groups of several partitions, and the
-- checkpoints of the interleaving tests.

-- An operation id's timestamps as Python's isoformat() in UTC with "Z"
-- (batches.operation_id): microseconds only when there are some.
CREATE FUNCTION {stamp}(p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN to_char(p_at AT TIME ZONE 'UTC', 'US') = '000000' THEN ''
            ELSE '.' || to_char(p_at AT TIME ZONE 'UTC', 'US') END
        || 'Z'
$fn$;

-- batches.operation_id, computed in the database: sha256 of
-- retention:<kind>:<partition>:<slot>:<cutoff>:<after_id>:<limit>.
CREATE FUNCTION {operation}(
    p_kind varchar, p_partition text, p_slot timestamptz, p_cutoff timestamptz, p_after text, p_limit integer
) RETURNS varchar
LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT encode(sha256(convert_to(
        'retention:' || p_kind || ':' || p_partition || ':' || {stamp}(p_slot) || ':' || {stamp}(p_cutoff)
            || ':' || p_after || ':' || p_limit, 'UTF8')), 'hex')
$fn$;

CREATE FUNCTION {batch}(
    p_job bigint, p_token uuid, p_property {property_key}, p_portfolio {portfolio_key}, p_kind varchar,
    p_slot timestamptz, p_cutoff timestamptz, p_version bigint, p_sweep bigint,
    p_now timestamptz, p_renew timestamptz, p_limit integer,
    OUT o_deleted integer, OUT o_outcome varchar, OUT o_lost boolean
)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict error
DECLARE
    v_id bigint;
    v_cursor bigint;
    v_deleted_before bigint;
    v_held_before bigint;
    v_scoped boolean;
    v_vid bigint;
    v_days integer;
    v_enabled boolean;
    v_size integer;
    v_guess_op varchar;
    v_op varchar;
    v_cutoff timestamptz;
    v_used_version bigint;
    v_limit integer;
    v_replayed boolean := false;
    v_replay_last bigint;
    v_candidates bigint := 0;
    v_last bigint;
    v_held bigint := 0;
    v_ledger boolean := false;
    r_job bigint;
    r_vid bigint;
    r_days integer;
    r_enabled boolean;
    r_size integer;
    r_op varchar;
    r_last bigint;
    r_state varchar;
    r_outcome varchar;
    r_doc text;
    r_count bigint;
    r_max bigint;
    -- The job's advance (lifecycle.after_batch), written with or without a
    -- ledger row.
    a_cursor bigint;
    a_batches integer := 0;
    a_deleted bigint := 0;
    a_held bigint := 0;
    a_size integer := 0;
    a_finish boolean := false;
    a_fixed varchar := '';
    a_state varchar;
    a_outcome varchar := '';
BEGIN
    o_deleted := 0;
    o_outcome := '';
    o_lost := false;
    -- a. The fence and the scope locks, with a first reading of the policy.
    FOR v_id, v_cursor, v_deleted_before, v_held_before, v_scoped, v_vid, v_days, v_enabled, v_size IN
        {fence}
    LOOP
    END LOOP;
    IF v_id IS NULL THEN
        o_lost := true;  -- the product raises LeaseLost
        RETURN;
    END IF;
    a_cursor := v_cursor;
    <<protocol>>
    BEGIN
        IF NOT v_scoped THEN
            a_finish := true;
            a_fixed := {scope_missing};
            EXIT protocol;
        END IF;
        -- The operation id the first reading gives: only the guess the
        -- replay lookup is made with (batches._operations).
        IF v_vid IS NOT NULL AND v_enabled THEN
            v_cutoff := least(p_slot - v_days * interval '24 hours', p_cutoff);
            v_guess_op := {operation}(
                p_kind, CAST(p_property AS text), p_slot, v_cutoff, CAST(v_cursor AS text),
                least(coalesce(p_limit, v_size), {max_batch})
            );
        END IF;
        -- b. The policy, read by a statement that starts once every lock is
        -- held; c. the replay lookup of the guessed operation id.
        v_vid := NULL;
        FOR r_job, r_vid, r_days, r_enabled, r_size, r_op, r_last IN
            {policy}
        LOOP
            IF r_op IS NULL THEN
                v_vid := r_vid;
                v_days := r_days;
                v_enabled := r_enabled;
                v_size := r_size;
            ELSE
                v_replayed := true;
                v_replay_last := r_last;
            END IF;
        END LOOP;
        IF v_vid IS NULL OR NOT v_enabled THEN
            a_finish := true;
            a_fixed := {policy_withdrawn};
            EXIT protocol;
        END IF;
        -- batches._plan: the stricter cutoff, the batch size, the operation id.
        IF p_slot - v_days * interval '24 hours' < p_cutoff THEN
            v_cutoff := p_slot - v_days * interval '24 hours';
            v_used_version := v_vid;
        ELSE
            v_cutoff := p_cutoff;
            v_used_version := p_version;
        END IF;
        v_limit := least(coalesce(p_limit, v_size), {max_batch});
        v_op := {operation}(p_kind, CAST(p_property AS text), p_slot, v_cutoff, CAST(v_cursor AS text), v_limit);
        IF v_op IS DISTINCT FROM v_guess_op THEN
            -- A version approved while the fence waited: look again.
            v_replayed := false;
            FOR r_op, r_last IN
                {lookup}
            LOOP
                v_replayed := true;
                v_replay_last := r_last;
            END LOOP;
        END IF;
        IF v_replayed THEN
            a_cursor := greatest(v_cursor, v_replay_last);
            EXIT protocol;
        END IF;
        -- d. The candidates and the DELETE, one statement planned for its
        -- values every time (EXECUTE), as the product's data statement is.
        FOR r_count, r_max, r_last, r_doc IN EXECUTE {delete}
            USING p_property, p_portfolio, v_cursor, v_cutoff, v_limit, p_kind
        LOOP
            IF r_count IS NOT NULL THEN
                -- The first row: candidates, last candidate id, held.
                v_candidates := r_count;
                v_last := r_max;
                v_held := r_last;
            ELSIF r_doc IS NOT NULL THEN
                RAISE EXCEPTION 'bench batch function: no outbox (record % names document %)', r_last, r_doc;
            ELSE
                o_deleted := o_deleted + 1;
            END IF;
        END LOOP;
        a_cursor := coalesce(v_last, v_cursor);
        a_held := v_held;
        a_size := v_limit;
        -- A short batch was the last one (batches._ledger_rows_and_advances).
        a_finish := v_candidates < v_limit;
        v_ledger := v_candidates > 0;
        a_batches := CASE WHEN v_ledger THEN 1 ELSE 0 END;
        a_deleted := o_deleted;
    END protocol;
    -- e. The ledger row (when there were candidates) and the job's advance, one statement.
    a_state := CASE WHEN a_finish THEN {done} ELSE {leased} END;
    IF a_finish THEN
        a_outcome := CASE
            WHEN a_fixed <> '' THEN a_fixed
            WHEN v_deleted_before + a_deleted > 0 THEN {deleted}
            WHEN v_held_before + a_held > 0 THEN {held}
            ELSE {nothing_eligible}
        END;
    END IF;
    IF v_ledger THEN
        FOR r_job, r_state, r_outcome IN
            {ledger_and_advance}
        LOOP
        END LOOP;
    ELSE
        FOR r_job, r_state, r_outcome IN
            {advance}
        LOOP
        END LOOP;
    END IF;
    IF r_state = {done} THEN
        o_outcome := r_outcome;
        -- The sweep finished with its last job, in the same transaction.
        FOR r_job IN
            {sweep_lock}
        LOOP
        END LOOP;
        IF FOUND THEN
            {sweep_finish};
        END IF;
    END IF;
END
$fn$;

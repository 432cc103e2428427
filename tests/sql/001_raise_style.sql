-- Every error a function of queue raises on purpose says what was wrong and what to do:
-- RAISE EXCEPTION '…' USING ERRCODE = '…', DETAIL = '…', HINT = '…'. This reads prosrc of every
-- function and procedure in schema queue and names each error-raising RAISE whose USING clause
-- has no DETAIL or no HINT. Catalog queries only; changes nothing.
--
-- pg_temp.raises(src) is a small tokenizer, not a PL/pgSQL parser: string literals ('…', with ''
-- inside) and comments (-- and /* */) are set aside first, so a ';' or a 'DETAIL =' inside a
-- message or a comment neither ends nor completes a statement; then each RAISE … ; is one
-- statement (whitespace normalised). RAISE DEBUG/LOG/INFO/NOTICE/WARNING and a bare RAISE; (the
-- re-raise in a handler) are not checked; every other RAISE is an error (EXCEPTION, the default
-- level, SQLSTATE '…', a condition name, USING MESSAGE). Not handled: backslash-escaped quotes in
-- E'…' strings and $tag$ quoting inside a body (no function uses either; the self-checks below
-- show what is).
BEGIN;
SELECT plan(16);

CREATE FUNCTION pg_temp.raises(src text)
    RETURNS TABLE (message text, has_detail boolean, has_hint boolean, errcode text)
    LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    v_lits  text[] := '{}';
    v_clean text := '';
    v_tok   text[];
    v_body  text;
BEGIN
    -- Tokens: a string literal | a comment | a run of anything else | one other character. The
    -- longest alternative wins at each point, so '--' is a comment and not two characters.
    FOR v_tok IN
        SELECT regexp_matches(src,
            $re$('[^']*(?:''[^']*)*')|(--[^\n]*|/\*(?:[^*]|\*+[^*/])*\*+/)|([^-'/]+|.)$re$, 'g')
    LOOP
        IF v_tok[1] IS NOT NULL THEN        -- a literal: kept aside, numbered in its place
            v_lits := v_lits || v_tok[1];
            v_clean := v_clean || ' ''' || cardinality(v_lits) || ''' ';
        ELSIF v_tok[2] IS NOT NULL THEN     -- a comment: a blank
            v_clean := v_clean || ' ';
        ELSE
            v_clean := v_clean || v_tok[3];
        END IF;
    END LOOP;
    v_clean := regexp_replace(v_clean, '\s+', ' ', 'g');

    FOR v_tok IN SELECT regexp_matches(v_clean, '\mRAISE\M([^;]*);', 'gi') LOOP
        v_body := btrim(v_tok[1]);
        CONTINUE WHEN v_body = '' OR v_body ~* '^(DEBUG|LOG|INFO|NOTICE|WARNING)\M';
        -- the first literal is the message (or the SQLSTATE); else the statement as written
        message := coalesce(v_lits[(regexp_match(v_body, '''([0-9]+)'''))[1]::integer], v_body);
        has_detail := v_body ~* '\mUSING\M.*\mDETAIL ?=';
        has_hint   := v_body ~* '\mUSING\M.*\mHINT ?=';
        -- the SQLSTATE when written as a literal (ERRCODE = '22023'), else NULL
        errcode    := pg_catalog.btrim(v_lits[(regexp_match(v_body, '\mERRCODE ?= ?''([0-9]+)''', 'i'))[1]::integer], '''');
        RETURN NEXT;
    END LOOP;
END
$f$;

CREATE TEMP VIEW queue_raises AS
SELECT p.oid::regprocedure::text AS function, r.*
  FROM pg_catalog.pg_proc p
 CROSS JOIN LATERAL pg_temp.raises(p.prosrc) r
 WHERE p.pronamespace = 'queue'::regnamespace;

-- The rule itself.
SELECT is_empty(
    $$SELECT function, message FROM queue_raises WHERE NOT has_detail ORDER BY 1, 2$$,
    'every RAISE EXCEPTION of a queue function has a DETAIL (listed: function and message of each that has none)'
);
SELECT is_empty(
    $$SELECT function, message FROM queue_raises WHERE NOT has_hint ORDER BY 1, 2$$,
    'every RAISE EXCEPTION of a queue function has a HINT (listed: function and message of each that has none)'
);

-- The check is not empty: it finds the raises there are, in every function that has one.
SELECT cmp_ok((SELECT count(*)::integer FROM queue_raises), '>=', 90,
              'the check reads at least 90 RAISE EXCEPTION statements in schema queue');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace AND p.prosrc ~* '\mRAISE\s+EXCEPTION\M'
      EXCEPT
      SELECT function FROM queue_raises$$,
    'every queue function whose source says RAISE EXCEPTION has its raises read'
);

-- The tokenizer on sources written for it.
SELECT results_eq(
    $$SELECT message, has_detail, has_hint FROM pg_temp.raises($s$
        IF x IS NULL THEN
            RAISE EXCEPTION 'x must not be NULL'
                USING ERRCODE = '22004', HINT = 'Pass an x.';
        END IF;
        RAISE EXCEPTION 'no hint' USING ERRCODE = '22023', DETAIL = 'x is 1.';
    $s$)$$,
    $$VALUES ('''x must not be NULL''', false, true), ('''no hint''', true, false)$$,
    'a missing DETAIL and a missing HINT are found, each in its own statement'
);
SELECT results_eq(
    $$SELECT message, has_detail, has_hint FROM pg_temp.raises($s$
        RAISE EXCEPTION 'a; b' USING ERRCODE = '22023', DETAIL = 'one; two', HINT = 'three; four';
        RAISE EXCEPTION 'it''s; here' USING HINT = 'not a DETAIL = ''x''; not one', ERRCODE = '22023';
        RAISE EXCEPTION '%', pg_catalog.format('%s; %s', 1, 2) USING DETAIL = '', HINT = '';
    $s$)$$,
    $$VALUES ('''a; b''', true, true), ('''it''''s; here''', false, true), ('''%''', true, true)$$,
    'a semicolon, a doubled quote or the word DETAIL inside a literal neither ends nor completes a statement'
);
SELECT results_eq(
    $$SELECT message, has_detail, has_hint FROM pg_temp.raises($s$
        -- RAISE EXCEPTION 'in a comment';
        /* RAISE EXCEPTION 'in a block comment' USING DETAIL = 'x'; */
        RAISE EXCEPTION 'commented detail' -- DETAIL = 'x',
            USING ERRCODE = '22023', /* DETAIL = 'y', */ HINT = 'h';
    $s$)$$,
    $$VALUES ('''commented detail''', false, true)$$,
    'a RAISE or a DETAIL inside a comment does not count'
);
SELECT is_empty(
    $$SELECT * FROM pg_temp.raises($s$
        RAISE NOTICE 'n %', 1;
        raise warning 'w';
        RAISE INFO 'i'; RAISE LOG 'l'; RAISE DEBUG 'd';
        BEGIN
            PERFORM 1;
        EXCEPTION WHEN others THEN
            RAISE;
        END;
        PERFORM queue._raise_not_live(1, 'cancel');
        v_raised := true;
    $s$)$$,
    'RAISE NOTICE, WARNING, INFO, LOG, DEBUG, a bare RAISE; and names that contain raise are not checked'
);
SELECT results_eq(
    $$SELECT message, has_detail, has_hint FROM pg_temp.raises($s$
        raise   exception
            'lower case'   using  errcode='22023',detail='d',
               hint='h';
        RAISE 'no level' USING DETAIL = 'd';
        RAISE SQLSTATE 'SK009' USING MESSAGE = 'by sqlstate', DETAIL = 'd', HINT = 'h';
        RAISE EXCEPTION USING MESSAGE = 'message in using', HINT = 'h';
        RAISE division_by_zero;
    $s$)$$,
    $$VALUES ('''lower case''', true, true), ('''no level''', true, false), ('''SK009''', true, true),
             ('''message in using''', false, true), ('division_by_zero', false, false)$$,
    'any case and spacing, the default level, SQLSTATE, USING MESSAGE and a condition name are errors to check'
);
SELECT results_eq(
    $$SELECT message, has_detail, has_hint FROM pg_temp.raises($s$
        RAISE EXCEPTION 'detail only in the message DETAIL = x, HINT = y';
        RAISE EXCEPTION 'e', v_detail USING ERRCODE = '22023';
    $s$)$$,
    $$VALUES ('''detail only in the message DETAIL = x, HINT = y''', false, false), ('''e''', false, false)$$,
    'a RAISE without USING has neither, whatever its message or arguments say'
);

-- Catches it where it matters: the source of a real function with its DETAIL taken out.
SELECT results_eq(
    $$SELECT message, has_detail, has_hint
        FROM pg_temp.raises(regexp_replace(
                 (SELECT prosrc FROM pg_catalog.pg_proc WHERE oid = 'queue.heartbeat(bigint,uuid,interval,text,jsonb)'::regprocedure),
                 'DETAIL = pg_catalog\.format\(''Task %s is not running[^)]*\),', ''))
       WHERE message = '''lease lost'''$$,
    $$VALUES ('''lease lost''', false, true)$$,
    'heartbeat''s lease lost without its DETAIL is caught'
);
SELECT is(
    (SELECT count(*)::integer FROM queue_raises WHERE function = 'queue.heartbeat(bigint,uuid,interval,text,jsonb)'),
    1,
    'heartbeat has its one RAISE EXCEPTION statement read (its argument errors raise through _raise_bad_argument)'
);
SELECT ok(
    (SELECT bool_and(has_detail AND has_hint) AND count(*) >= 40
       FROM queue_raises WHERE function = 'queue._raise_bad_argument(text,text,jsonb)'),
    'the argument errors of _raise_bad_argument are read and have DETAIL and HINT'
);

-- One way to check an argument (docs/decisions.md): a function names its first bad argument in
-- one guard and calls queue._raise_bad_argument, which raises; no function raises an argument
-- error (22004, 22023, 54000) itself. Besides _raise_bad_argument, only the checkers it calls
-- for a value that needs more than an expression (a stage name, a stages array, a JSON value),
-- the cron parser (_cron_parse and _cron_next find the error while parsing) and run_sql_tasks
-- (a procedure that runs as its caller, who may not call the internal _raise_bad_argument).
SELECT is_empty(
    $$SELECT function, message FROM queue_raises
       WHERE errcode IN ('22004', '22023', '54000')
         AND function NOT IN ('queue._raise_bad_argument(text,text,jsonb)', 'queue._check_stage(text,text)',
                              'queue._check_stages(text[])', 'queue._check_payload(jsonb,text)',
                              'queue._cron_parse(text)', 'queue._cron_next(text,timestamp with time zone,text)',
                              'queue.run_sql_tasks(text,integer,text,integer)')
       ORDER BY 1, 2$$,
    'no queue function raises an argument error (22004, 22023, 54000) itself but _raise_bad_argument and its checkers (listed: function and message of each that does)'
);
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND p.prosrc ~ 'queue\._check_(stage|stages|payload)\('
         AND p.oid NOT IN ('queue._raise_bad_argument(text,text,jsonb)'::regprocedure, 'queue._check_stages(text[])'::regprocedure)
       ORDER BY 1$$,
    'only _raise_bad_argument calls the checkers _check_stage, _check_stages and _check_payload: every other function tests its arguments in its guard (listed: those that call one)'
);
SELECT results_eq(
    $$SELECT message, errcode FROM pg_temp.raises($s$
        IF x IS NULL THEN
            RAISE EXCEPTION 'x must not be NULL' USING ERRCODE = '22004', DETAIL = 'd', HINT = 'h';
        END IF;
        RAISE EXCEPTION 'e' USING DETAIL = 'ERRCODE = ''22023''', errcode='54000', HINT = 'h';
        RAISE EXCEPTION 'f' USING ERRCODE = CASE WHEN x IS NULL THEN '22004' ELSE '22023' END, DETAIL = 'd', HINT = 'h';
    $s$)$$,
    $$VALUES ('''x must not be NULL''', '22004'), ('''e''', '54000'), ('''f''', NULL)$$,
    'the SQLSTATE of a RAISE is read from its ERRCODE literal (not from a DETAIL that quotes one)'
);

SELECT * FROM finish();
ROLLBACK;

-- queue._cron_parse: every field kind (*, values, ranges, steps, lists), month and day names,
-- 7 = Sunday, the macros, the day-of-month/day-of-week star flags, and an error naming the field
-- for everything it cannot read.
BEGIN;
SELECT plan(84);

-- The SQLSTATE and DETAIL of the error _cron_parse raises (NULL when it raises none).
CREATE FUNCTION pg_temp.cron_error(expr text)
    RETURNS text
    LANGUAGE plpgsql
AS $$
DECLARE
    v_state  text;
    v_detail text;
BEGIN
    PERFORM queue._cron_parse(expr);
    RETURN NULL;
EXCEPTION WHEN invalid_parameter_value OR null_value_not_allowed THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_state || ' ' || v_detail;
END
$$;

CREATE FUNCTION pg_temp.cron_hint(expr text)
    RETURNS text
    LANGUAGE plpgsql
AS $$
DECLARE
    v_hint text;
BEGIN
    PERFORM queue._cron_parse(expr);
    RETURN NULL;
EXCEPTION WHEN invalid_parameter_value THEN
    GET STACKED DIAGNOSTICS v_hint = PG_EXCEPTION_HINT;
    RETURN v_hint;
END
$$;

-- * and single values --------------------------------------------------------------------------------------------
SELECT is(queue._cron_parse('* * * * *'),
          ROW(ARRAY(SELECT pg_catalog.generate_series(0, 59)), ARRAY(SELECT pg_catalog.generate_series(0, 23)),
              ARRAY(SELECT pg_catalog.generate_series(1, 31)), ARRAY(SELECT pg_catalog.generate_series(1, 12)),
              ARRAY[0, 1, 2, 3, 4, 5, 6], true, true)::queue.cron_fields,
          '* allows every value of each field (day of week 0-6); both day fields are unrestricted');
SELECT is(queue._cron_parse('5 4 3 2 1'),
          ROW('{5}'::integer[], '{4}'::integer[], '{3}'::integer[], '{2}'::integer[], '{1}'::integer[], false, false)::queue.cron_fields,
          'single values, one per field');
SELECT is(queue._cron_parse('59 23 31 12 6'),
          ROW('{59}'::integer[], '{23}'::integer[], '{31}'::integer[], '{12}'::integer[], '{6}'::integer[], false, false)::queue.cron_fields,
          'the highest value of every field is accepted');
SELECT is(queue._cron_parse('0 0 1 1 0'),
          ROW('{0}'::integer[], '{0}'::integer[], '{1}'::integer[], '{1}'::integer[], '{0}'::integer[], false, false)::queue.cron_fields,
          'the lowest value of every field is accepted');

-- Ranges ---------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_parse('10-15 9-17 1-5 6-8 1-5'),
          ROW('{10,11,12,13,14,15}'::integer[], '{9,10,11,12,13,14,15,16,17}'::integer[], '{1,2,3,4,5}'::integer[],
              '{6,7,8}'::integer[], '{1,2,3,4,5}'::integer[], false, false)::queue.cron_fields,
          'a range a-b in each field includes both ends');
SELECT is((queue._cron_parse('7-7 * * * *')).minute, '{7}'::integer[], 'a range of one value a-a');

-- Steps ----------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_parse('*/15 */6 */10 */3 */2'),
          ROW('{0,15,30,45}'::integer[], '{0,6,12,18}'::integer[], '{1,11,21,31}'::integer[],
              '{1,4,7,10}'::integer[], '{0,2,4,6}'::integer[], true, true)::queue.cron_fields,
          '*/n in each field counts from the field''s lowest value; */n day fields count as unrestricted');
SELECT is((queue._cron_parse('10-30/10 * * * *')).minute, '{10,20,30}'::integer[], 'a-b/n: every n-th value of the range');
SELECT is((queue._cron_parse('* 9-17/4 * * *')).hour, '{9,13,17}'::integer[], 'a-b/n in the hour field');
SELECT is((queue._cron_parse('1-10/4 * * * *')).minute, '{1,5,9}'::integer[], 'a-b/n stops at the last step inside the range');
SELECT is((queue._cron_parse('5/20 * * * *')).minute, '{5,25,45}'::integer[], 'a/n: from a to the end of the field, every n');
SELECT is((queue._cron_parse('* 20/2 * * *')).hour, '{20,22}'::integer[], 'a/n in the hour field');
SELECT is((queue._cron_parse('* * * * 1/2')).dow, '{0,1,3,5}'::integer[], 'a/n in day of week runs to 7, which is Sunday (0)');
SELECT is((queue._cron_parse('*/1 * * * *')).minute, ARRAY(SELECT pg_catalog.generate_series(0, 59)), '*/1 is every value');
SELECT is((queue._cron_parse('*/59 * * * *')).minute, '{0,59}'::integer[], 'a step as large as the field''s maximum is accepted');
SELECT is((queue._cron_parse('* * * * */7')).dow, '{0}'::integer[], '*/7 in day of week: 0 and 7, both Sunday');

-- Lists ----------------------------------------------------------------------------------------------------------
SELECT is((queue._cron_parse('0,30 * * * *')).minute, '{0,30}'::integer[], 'a list of values');
SELECT is((queue._cron_parse('45,1-3,10,20-24/2 * * * *')).minute, '{1,2,3,10,20,22,24,45}'::integer[],
          'a list mixing values, ranges and steps, sorted');
SELECT is((queue._cron_parse('5,5,1-6,6 * * * *')).minute, '{1,2,3,4,5,6}'::integer[], 'values named twice appear once');
SELECT is((queue._cron_parse('* 0,12 1,15 1,7 0,3')),
          ROW(ARRAY(SELECT pg_catalog.generate_series(0, 59)), '{0,12}'::integer[], '{1,15}'::integer[],
              '{1,7}'::integer[], '{0,3}'::integer[], false, false)::queue.cron_fields,
          'lists in every field');

-- Month and day names --------------------------------------------------------------------------------------------
SELECT is((queue._cron_parse('0 0 1 jan *')).month, '{1}'::integer[], 'a month name');
SELECT is((queue._cron_parse('0 0 1 JAN-Mar *')).month, '{1,2,3}'::integer[], 'a range of month names, any case');
SELECT is((queue._cron_parse('0 0 1 dec,jun,feb *')).month, '{2,6,12}'::integer[], 'a list of month names, sorted');
SELECT is((queue._cron_parse('0 0 1 jan-dec/3 *')).month, '{1,4,7,10}'::integer[], 'a stepped range of month names');
SELECT is((queue._cron_parse('0 0 1 feb,10 *')).month, '{2,10}'::integer[], 'month names and numbers mixed');
SELECT is((queue._cron_parse('0 0 1 1 *')).month = (queue._cron_parse('0 0 1 jan *')).month
          AND (queue._cron_parse('0 0 1 12 *')).month = (queue._cron_parse('0 0 1 DEC *')).month, true,
          'jan is 1 and dec is 12');
SELECT is((queue._cron_parse('0 0 * * mon-fri')).dow, '{1,2,3,4,5}'::integer[], 'a range of day names');
SELECT is((queue._cron_parse('0 0 * * SUN')).dow, '{0}'::integer[], 'sun is 0, any case');
SELECT is((queue._cron_parse('0 0 * * sat,Sun')).dow, '{0,6}'::integer[], 'a list of day names');
SELECT is((queue._cron_parse('0 0 * * tue/2')).dow, '{2,4,6}'::integer[], 'a day name with a step: tue/2 is Tuesday, Thursday, Saturday');

-- 7 is Sunday ----------------------------------------------------------------------------------------------------
SELECT is((queue._cron_parse('0 0 * * 7')).dow, '{0}'::integer[], 'day of week 7 is Sunday, stored as 0');
SELECT is((queue._cron_parse('0 0 * * 5-7')).dow, '{0,5,6}'::integer[], 'a range ending at 7 includes Sunday as 0');
SELECT is((queue._cron_parse('0 0 * * 0,7')).dow, '{0}'::integer[], '0 and 7 together are one Sunday');

-- Macros ---------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_parse('@hourly'), queue._cron_parse('0 * * * *'), '@hourly is 0 * * * *');
SELECT is(queue._cron_parse('@daily'), queue._cron_parse('0 0 * * *'), '@daily is 0 0 * * *');
SELECT is(queue._cron_parse('@midnight'), queue._cron_parse('0 0 * * *'), '@midnight is 0 0 * * *');
SELECT is(queue._cron_parse('@weekly'), queue._cron_parse('0 0 * * 0'), '@weekly is 0 0 * * 0');
SELECT is(queue._cron_parse('@monthly'), queue._cron_parse('0 0 1 * *'), '@monthly is 0 0 1 * *');
SELECT is(queue._cron_parse('@yearly'), queue._cron_parse('0 0 1 1 *'), '@yearly is 0 0 1 1 *');
SELECT is(queue._cron_parse('@annually'), queue._cron_parse('0 0 1 1 *'), '@annually is 0 0 1 1 *');
SELECT is(queue._cron_parse(E' @DAILY\n'), queue._cron_parse('0 0 * * *'), 'macros ignore case and surrounding blanks');

-- Blanks and the day-field flags -----------------------------------------------------------------------------------
SELECT is(queue._cron_parse(E'  */5\t*   * *  *  '), queue._cron_parse('*/5 * * * *'),
          'fields may be separated by any run of spaces and tabs, with blanks around');
SELECT results_eq(
    $$SELECT (f).dom_star, (f).dow_star
        FROM (VALUES (queue._cron_parse('0 0 1 * *')), (queue._cron_parse('0 0 * * 1')),
                     (queue._cron_parse('0 0 1 * 1')), (queue._cron_parse('0 0 */2 * 1')),
                     (queue._cron_parse('0 0 1-31 * 0-7'))) AS v(f)$$,
    $$VALUES (false, true), (true, false), (false, false), (true, false), (false, false)$$,
    'a day field is unrestricted exactly when it begins with * (1-31 and 0-7 count as restricted, as in Vixie cron)');

-- Out of range, one field at a time --------------------------------------------------------------------------------
SELECT is(pg_temp.cron_error('60 * * * *'), '22023 Field 1 (minute) is ''60'': 60 is outside 0-59.', 'minute 60 raises 22023 naming the minute field');
SELECT is(pg_temp.cron_error('* 24 * * *'), '22023 Field 2 (hour) is ''24'': 24 is outside 0-23.', 'hour 24 raises 22023 naming the hour field');
SELECT is(pg_temp.cron_error('* * 0 * *'), '22023 Field 3 (day-of-month) is ''0'': 0 is outside 1-31.', 'day of month 0 raises 22023');
SELECT is(pg_temp.cron_error('* * 32 * *'), '22023 Field 3 (day-of-month) is ''32'': 32 is outside 1-31.', 'day of month 32 raises 22023');
SELECT is(pg_temp.cron_error('* * * 0 *'), '22023 Field 4 (month) is ''0'': 0 is outside 1-12.', 'month 0 raises 22023');
SELECT is(pg_temp.cron_error('* * * 13 *'), '22023 Field 4 (month) is ''13'': 13 is outside 1-12.', 'month 13 raises 22023');
SELECT is(pg_temp.cron_error('* * * * 8'), '22023 Field 5 (day-of-week) is ''8'': 8 is outside 0-7.', 'day of week 8 raises 22023');
SELECT is(pg_temp.cron_error('1,2,99 * * * *'), '22023 Field 1 (minute) is ''1,2,99'': 99 is outside 0-59.', 'a bad value inside a list is found');
SELECT is(pg_temp.cron_error('* 1-25 * * *'), '22023 Field 2 (hour) is ''1-25'': 25 is outside 0-23.', 'a range ending outside the field raises');
SELECT is(pg_temp.cron_error('123456789012 * * * *'), '22023 Field 1 (minute) is ''123456789012'': 123456789012 is outside 0-59.',
          'a huge number raises 22023, not an integer overflow');

-- Steps ------------------------------------------------------------------------------------------------------------
SELECT is(pg_temp.cron_error('*/0 * * * *'), '22023 Field 1 (minute) is ''*/0'': the step 0 is outside 1-59.', 'step 0 raises 22023');
SELECT is(pg_temp.cron_error('* 1-5/0 * * *'), '22023 Field 2 (hour) is ''1-5/0'': the step 0 is outside 1-23.', 'step 0 on a range raises 22023');
SELECT is(pg_temp.cron_error('*/123456789012 * * * *'), '22023 Field 1 (minute) is ''*/123456789012'': the step 123456789012 is outside 1-59.',
          'a huge step raises 22023, not an integer overflow');
SELECT is(pg_temp.cron_error('* * * */13 *'), '22023 Field 4 (month) is ''*/13'': the step 13 is outside 1-12.', 'a step beyond the field raises 22023');

-- Reversed ranges --------------------------------------------------------------------------------------------------
SELECT is(pg_temp.cron_error('30-10 * * * *'), '22023 Field 1 (minute) is ''30-10'': the range ''30-10'' runs backwards.', 'a reversed minute range raises 22023');
SELECT is(pg_temp.cron_error('* * * dec-jan *'), '22023 Field 4 (month) is ''dec-jan'': the range ''dec-jan'' runs backwards.', 'a reversed range of month names raises 22023');
SELECT is(pg_temp.cron_error('* * * * fri-mon'), '22023 Field 5 (day-of-week) is ''fri-mon'': the range ''fri-mon'' runs backwards.', 'a reversed range of day names raises 22023');

-- Garbage ----------------------------------------------------------------------------------------------------------
SELECT is(pg_temp.cron_error('x * * * *'), '22023 Field 1 (minute) is ''x'': ''x'' is not a value of this field.', 'a word in the minute field raises 22023');
SELECT is(pg_temp.cron_error('* * * mon *'), '22023 Field 4 (month) is ''mon'': ''mon'' is not a value of this field.', 'a day name in the month field raises 22023');
SELECT is(pg_temp.cron_error('* * * * jan'), '22023 Field 5 (day-of-week) is ''jan'': ''jan'' is not a value of this field.', 'a month name in the day-of-week field raises 22023');
SELECT is(pg_temp.cron_error('* * * * monday'), '22023 Field 5 (day-of-week) is ''monday'': ''monday'' is not a value of this field.', 'full day names are not accepted (three letters only)');
SELECT is(pg_temp.cron_error('1-2-3 * * * *'), '22023 Field 1 (minute) is ''1-2-3'': ''1-2-3'' cannot be read.', 'a double range raises 22023');
SELECT is(pg_temp.cron_error('* 1,,2 * * *'), '22023 Field 2 (hour) is ''1,,2'': '''' cannot be read.', 'an empty list element raises 22023');
SELECT is(pg_temp.cron_error('* * */ * *'), '22023 Field 3 (day-of-month) is ''*/'': ''*/'' cannot be read.', 'a step without a number raises 22023');
SELECT is(pg_temp.cron_error('* * * * -1'), '22023 Field 5 (day-of-week) is ''-1'': ''-1'' cannot be read.', 'a negative number raises 22023');
SELECT is(pg_temp.cron_error('@reboot'), '22023 ''@reboot'' is not a known macro.', '@reboot (and any unknown macro) raises 22023');
-- Quoted as written, not lower-cased.
SELECT is(pg_temp.cron_error('0 0 L * *'), '22023 Field 3 (day-of-month) is ''L'': ''L'' is not a value of this field.',
          'L (no last-day syntax) is quoted as written, upper case');
SELECT is(pg_temp.cron_error('0 0 * * MON-Sunday'), '22023 Field 5 (day-of-week) is ''MON-Sunday'': ''Sunday'' is not a value of this field.',
          'a field with a bad name is quoted as written');
SELECT is(pg_temp.cron_error('0 0 * * FRI-MON'), '22023 Field 5 (day-of-week) is ''FRI-MON'': the range ''FRI-MON'' runs backwards.',
          'a reversed range of names in upper case is quoted as written');
SELECT is(pg_temp.cron_error('0 0 ? * Mon'), '22023 Field 3 (day-of-month) is ''?'': ''?'' cannot be read.', 'setup: ? cannot be read');
SELECT is(pg_temp.cron_error('0 0 1 * 1#2 X'), '22023 ''0 0 1 * 1#2 X'' has 6 fields, not 5.', 'the field count quotes the expression as written');
SELECT is((queue._cron_parse('0 0 * * MON-fri')).dow, '{1,2,3,4,5}'::integer[], 'names still match in any case');
SELECT is(pg_temp.cron_error('@Reboot'), '22023 ''@Reboot'' is not a known macro.', 'an unknown macro is quoted as written');
SELECT is((queue._cron_parse('@DAILY')).hour, '{0}'::integer[], 'macros still match in any case');

-- Field count and NULL ---------------------------------------------------------------------------------------------
SELECT is(pg_temp.cron_error('* * * *'), '22023 ''* * * *'' has 4 fields, not 5.', 'four fields raise 22023');
SELECT is(pg_temp.cron_error('0 * * * * *'), '22023 ''0 * * * * *'' has 6 fields, not 5.', 'six fields raise 22023 (no seconds field)');
SELECT is(pg_temp.cron_error('   '), '22023 ''   '' has 0 fields, not 5.', 'a blank expression raises 22023');
SELECT throws_ok($$SELECT queue._cron_parse(NULL)$$, '22004', 'cron expression must not be NULL', 'NULL raises 22004');

-- The message and hint a person reads.
SELECT throws_ok($$SELECT queue._cron_parse('* * * * 9')$$, '22023', 'invalid cron expression',
                 'the message of a bad field is ''invalid cron expression''');
SELECT is(pg_temp.cron_hint('* * * * 9'),
          'The day-of-week field takes 0-7 (0 and 7 are Sunday) or sun-sat. Write *, a value, a range a-b, a step */n, a-b/n or a/n, or a list of these separated by commas.',
          'the hint says what the field takes and how to write it');
SELECT matches(pg_temp.cron_hint('* * * *'), 'minute hour day-of-month month day-of-week',
               'the hint for a wrong field count names the five fields');

SELECT * FROM finish();
ROLLBACK;

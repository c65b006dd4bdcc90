//! The connection's prepared statements and its transactions' batches,
//! against `DURUN_TEST_POSTGRES`.

use super::{Conn, Queries as _};

/// `DURUN_TEST_POSTGRES`, or `None` (said skipped).
pub(in crate::journal::postgres) fn test_url() -> Option<String> {
    let Ok(url) = std::env::var("DURUN_TEST_POSTGRES") else {
        assert!(
            std::env::var_os("DURUN_REQUIRE_POSTGRES").is_none(),
            "DURUN_REQUIRE_POSTGRES is set and DURUN_TEST_POSTGRES is not"
        );
        eprintln!("skipped: DURUN_TEST_POSTGRES is not set");
        return None;
    };
    Some(url)
}

/// A connection to `DURUN_TEST_POSTGRES`, or `None` (said skipped).
pub(in crate::journal::postgres) fn connect() -> Option<Conn> {
    let client = postgres::Client::connect(&test_url()?, postgres::NoTls).expect("connect");
    Some(Conn::new(client, false))
}

fn synchronous_commit(conn: &mut Conn, unsynced: bool) -> String {
    let mut tx = conn.begin(unsynced, "");
    let setting: String = tx
        .query_one("SHOW synchronous_commit", &[])
        .expect("show")
        .get(0);
    tx.commit().expect("commit");
    setting
}

#[test]
fn a_transaction_is_unsynced_when_asked_or_when_its_connection_is() {
    let Some(mut conn) = connect() else { return };
    conn.batch_execute("SET synchronous_commit TO on")
        .expect("set");
    assert_eq!(synchronous_commit(&mut conn, false), "on");
    assert_eq!(synchronous_commit(&mut conn, true), "off");
    conn.unsynced = true;
    assert_eq!(synchronous_commit(&mut conn, false), "off");
    // The session's own setting is left as it was.
    let row = conn
        .query_one("SHOW synchronous_commit", &[])
        .expect("show");
    assert_eq!(row.get::<_, String>(0), "on");
}

#[test]
fn a_transaction_not_committed_or_whose_commit_failed_rolls_back() {
    let Some(mut conn) = connect() else { return };
    conn.batch_execute("CREATE TEMPORARY TABLE t (n INTEGER)")
        .expect("table");
    let count = |conn: &mut Conn| -> i64 {
        conn.query_one("SELECT count(*) FROM t", &[])
            .expect("count")
            .get(0)
    };
    {
        let mut tx = conn.begin(false, "");
        tx.execute("INSERT INTO t VALUES (1)", &[]).expect("insert");
    }
    assert_eq!(count(&mut conn), 0, "a dropped transaction rolled back");
    let mut tx = conn.begin(true, "");
    tx.execute("INSERT INTO t VALUES (2)", &[]).expect("insert");
    tx.commit_after("SELECT 1/0")
        .expect_err("the last statement fails");
    // The session is out of the failed transaction: it answers.
    assert_eq!(count(&mut conn), 0, "a failed commit rolled back");
    let mut tx = conn.begin(false, "LISTEN durun_cached_test");
    tx.execute("INSERT INTO t VALUES (3)", &[]).expect("insert");
    tx.commit_after("UNLISTEN durun_cached_test")
        .expect("commit");
    assert_eq!(count(&mut conn), 1);
    // A setup that fails (with the first round trip) leaves no
    // transaction open.
    let mut tx = conn.begin(false, "SELECT 1/0");
    tx.execute("INSERT INTO t VALUES (4)", &[])
        .expect_err("the setup fails");
    drop(tx);
    assert_eq!(count(&mut conn), 1, "the session answers");
    let tx = conn.begin(false, "SELECT 1/0");
    tx.commit().expect_err("the setup fails");
    assert_eq!(count(&mut conn), 1, "the session answers");
}

#[test]
fn a_transactions_notifies_go_with_its_commit_and_none_with_a_rollback() {
    use postgres::fallible_iterator::FallibleIterator as _;
    let Some(mut conn) = connect() else { return };
    conn.batch_execute("LISTEN durun_cached_news")
        .expect("listen");
    {
        let mut tx = conn.begin(false, "");
        tx.notify_channel("durun_cached_news", "dropped")
            .expect("notify");
    }
    let mut tx = conn.begin(false, "");
    tx.notify_channel("durun_cached_news", "committed")
        .expect("notify");
    // Not plain: sent at once, as a parameter.
    tx.notify_channel("durun_cached_news", "it's")
        .expect("notify");
    tx.commit().expect("commit");
    conn.batch_execute("SELECT 1").expect("a round trip");
    let heard: Vec<String> = conn
        .client
        .notifications()
        .iter()
        .map(|note| Ok(note.payload().to_owned()))
        .collect()
        .expect("notifications");
    assert_eq!(heard, ["it's", "committed"]);
}

#[test]
fn a_transaction_of_writes_that_need_no_answer_is_one_round_trip() {
    use crate::journal::sql::Sql;
    use crate::journal::tx::{Arg, Tx as _};
    static INSERT: Sql = Sql::new("INSERT INTO t VALUES ($1, $2)");
    static READ: Sql = Sql::new(
        "SELECT n, s, n < 0, s IS NULL, (SELECT count(*) FROM t WHERE s = $2) FROM t WHERE n = $1",
    );
    let Some(mut conn) = connect() else { return };
    conn.batch_execute("CREATE TEMPORARY TABLE t (n BIGINT, s TEXT)")
        .expect("table");
    let texts = [
        "it's",
        "$d$",
        "ends in $d",
        "$d1$ and $d$",
        "back\\slash \\' and \"quotes\"",
        "-- not a comment\n; DROP TABLE t; --",
        "ünïcødé ✓",
        "",
    ];
    let mut tx = conn.begin(false, "");
    for (n, text) in texts.iter().enumerate() {
        tx.execute_later(&INSERT, &[Arg::Int(n as i64 - 3), Arg::Text(text)])
            .expect("later");
    }
    tx.execute_later(&INSERT, &[Arg::Null, Arg::Null])
        .expect("later");
    // Nothing was sent yet: the transaction is not there.
    assert!(!tx.later.is_empty() && tx.begin.is_some());
    tx.commit().expect("commit");
    let rows = conn
        .client
        .query("SELECT n, s FROM t ORDER BY n NULLS LAST", &[])
        .expect("rows");
    let read: Vec<(Option<i64>, Option<String>)> =
        rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let mut wanted: Vec<(Option<i64>, Option<String>)> = texts
        .iter()
        .enumerate()
        .map(|(n, text)| (Some(n as i64 - 3), Some((*text).to_owned())))
        .collect();
    wanted.push((None, None));
    assert_eq!(read, wanted, "each value reads back as it was written");

    // The first statement that needs an answer goes with the BEGIN,
    // and reads as a prepared one would.
    let mut tx = conn.begin(true, "");
    tx.execute_later(&INSERT, &[Arg::Int(100), Arg::Null])
        .expect("later");
    tx.notify_channel("durun_cached_test", "read")
        .expect("notify");
    let mut rows = Vec::new();
    crate::journal::tx::Tx::query(
        &mut tx,
        &READ,
        &[Arg::Int(-3), Arg::Text("it's")],
        &mut |row| {
            rows.push((
                row.int(0)?,
                row.text(1)?.map(str::to_owned),
                row.boolean(2)?,
                row.boolean(3)?,
                row.some_int(4)?,
            ));
            Ok(())
        },
    )
    .expect("query");
    assert!(
        tx.begin.is_none() && tx.later.is_empty(),
        "the BEGIN and the write went with it"
    );
    assert!(!tx.at_commit.is_empty(), "the NOTIFY waits for the COMMIT");
    assert_eq!(
        rows,
        [(
            Some(-3),
            Some("it's".to_owned()),
            Some(true),
            Some(false),
            1
        )]
    );
}

/// A statement in a batch is prepared by name once a session and run with
/// `EXECUTE` after. One whose batch failed is prepared again under a new
/// name, whether or not its `PREPARE` ran: no `EXECUTE` of a statement
/// never prepared, no `PREPARE` of a name taken.
#[test]
fn a_batch_prepares_each_statement_once_a_session() {
    use crate::journal::sql::Sql;
    use crate::journal::tx::{Arg, Tx as _};
    static INSERT: Sql = Sql::new("INSERT INTO t VALUES ($1, $2)");
    static FAILS: Sql = Sql::new("INSERT INTO t VALUES (1 / ($1 - 9), $2)");
    static LATER: Sql = Sql::new("UPDATE t SET s = $2 WHERE n = $1 RETURNING n");
    let Some(mut conn) = connect() else { return };
    conn.batch_execute("CREATE TEMPORARY TABLE t (n BIGINT, s TEXT)")
        .expect("table");
    let named = |conn: &mut Conn| -> Vec<String> {
        conn.client
            .query(
                "SELECT name FROM pg_prepared_statements WHERE name LIKE 'durun%' ORDER BY name",
                &[],
            )
            .expect("names")
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    for n in 0..3 {
        let mut tx = conn.begin(false, "");
        tx.execute_later(&INSERT, &[Arg::Int(n), Arg::Text("x")])
            .expect("later");
        tx.commit().expect("commit");
    }
    assert_eq!(named(&mut conn), ["durun_0"]);
    // Fails before LATER's PREPARE runs, then after FAILS' did.
    for (first, n) in [(&FAILS, 9), (&INSERT, 5)] {
        let mut tx = conn.begin(false, "");
        tx.execute_later(first, &[Arg::Int(n), Arg::Null])
            .expect("later");
        let failed = tx.query_last(
            &LATER,
            &[Arg::Int(if n == 9 { 0 } else { 9 }), Arg::Null],
            &mut |_| Ok(()),
        );
        if n == 9 {
            assert!(failed.is_err(), "division by zero");
        } else {
            failed.expect("LATER prepared again, under a new name");
        }
    }
    let mut tx = conn.begin(false, "");
    tx.execute_later(&FAILS, &[Arg::Int(10), Arg::Text("y")])
        .expect("later");
    tx.commit().expect("FAILS prepared again, under a new name");
    assert_eq!(
        named(&mut conn),
        ["durun_0", "durun_1", "durun_3", "durun_4"],
        "FAILS' first name (1) stayed taken; LATER's first (2) was never prepared"
    );
}

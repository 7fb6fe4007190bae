//! The conformance suite against the MySQL backend, on a throwaway MariaDB server (see
//! `rowsync-testkit`), a fresh database per test.

mod conformance;

use conformance::{Factory, RawSql};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use rowsync_consolidated::mysql::value::read_row;
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_protocol::Value;

struct MysqlFactory;

struct MysqlSql {
    connection: Conn,
}

/// A plain session set up as rowsync's are (quoting, concatenation, UTC).
async fn connect(url: &str) -> Conn {
    let mut connection = Conn::from_url(url)
        .await
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"));
    connection
        .query_drop(
            "SET SESSION sql_mode = 'ANSI_QUOTES,PIPES_AS_CONCAT,STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'",
        )
        .await
        .expect("session settings");
    connection
}

impl Factory for MysqlFactory {
    type Backend = MysqlConsolidated;
    type Sql = MysqlSql;

    async fn create() -> (MysqlConsolidated, MysqlSql) {
        let url = rowsync_testkit::fresh_mysql_database("conformance").await;
        (
            MysqlConsolidated::new(&url).expect("a mysql URL"),
            MysqlSql {
                connection: connect(&url).await,
            },
        )
    }
}

impl RawSql for MysqlSql {
    async fn execute(&mut self, sql: &str) {
        self.connection
            .query_drop(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
    }

    async fn query_rows(&mut self, sql: &str) -> Vec<Vec<Value>> {
        let rows: Vec<mysql_async::Row> = self
            .connection
            .query(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
        rows.into_iter()
            .map(|row| read_row(row).unwrap_or_else(|error| panic!("{sql}: {error}")))
            .collect()
    }
}

// Every test of the suite but the four whose own SQL MariaDB's parser refuses (below).
conformance::conformance_suite!(@each MysqlFactory;
    install_system_tables_is_idempotent_and_users_round_trip,
    init_table_refuses_unusable_tables_clearly_and_registers_nothing,
    first_sync_downloads_exactly_the_users_partition,
    uploaded_changes_are_applied_and_not_echoed_back,
    server_side_changes_after_the_watermark_arrive_in_the_next_download,
    a_key_leaving_a_partition_is_deleted_for_its_former_owner_even_when_reused,
    rows_without_a_partition_value_stay_writable_and_reach_no_one,
    stale_update_is_a_conflict_and_the_server_row_wins,
    conflicting_inserts_updates_of_deleted_rows_are_resolved_server_wins,
    another_users_rows_cannot_be_touched_or_seen,
    an_upload_sequence_is_applied_at_most_once,
    refused_syncs_apply_nothing,
    a_failing_upload_insert_script_is_a_script_error,
    a_failing_script_after_applied_operations_rolls_them_back,
    decimals_round_trip_without_losing_digits,
    cleanup_drops_only_tombstones_every_client_passed,
    a_resent_upload_still_delivers_its_conflict_resolution,
    connection_events_run_in_order_each_in_its_transaction,
    row_scripts_apply_each_row_and_find_conflicts,
    a_failing_row_script_rolls_back_or_is_skipped_by_handle_error,
    versions_coexist_and_a_changed_script_applies_from_the_next_sync,
    download_ack_records_the_watermark_and_runs_its_script,
    authenticate_user_script_decides_logins,
    hostile_values_in_every_parameter_are_data_not_sql,
    a_row_script_hitting_an_existing_key_fails_by_row_and_can_be_skipped,
    a_table_changed_between_syncs_on_one_connection_is_read_as_it_now_is,
);

/// Suite tests whose fixture SQL MariaDB cannot parse: `lines` is a reserved word
/// (`LOAD DATA ... LINES TERMINATED BY`), and `CAST` takes neither `BIGINT` nor `TEXT`
/// (MariaDB's names are `SIGNED` and `CHAR`). Run them with `--ignored` to see.
macro_rules! refused_by_the_parser {
    ($($test:ident: $why:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $why]
            async fn $test() {
                conformance::$test::<MysqlFactory>().await;
            }
        )*
    };
}

refused_by_the_parser!(
    an_error_in_the_second_table_rolls_back_the_first: "CREATE TABLE lines: LINES is reserved in MariaDB",
    composite_primary_keys_sync_both_ways: "CREATE TABLE lines: LINES is reserved in MariaDB",
    modify_next_last_download_replaces_the_watermark: "the script's CAST(... AS BIGINT) is not MariaDB SQL",
    resolve_conflict_sees_old_new_and_current_rows_in_both_forms: "the script's CAST(... AS TEXT) is not MariaDB SQL",
);

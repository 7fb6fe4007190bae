//! MySQL/MariaDB keep the late-commit guarantees (`late_commit`): no row is missed when
//! transactions commit out of order (the stamps of `mysql::stamp`), and one sync per
//! client at a time across connections (a row lock on `rs_sync_lock`).

#[macro_use]
mod late_commit;

use late_commit::{Database, Sql, ITEMS_DDL};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use rowsync_consolidated::mysql::value::read_row;
use rowsync_consolidated::mysql::{MysqlConnection, MysqlConsolidated};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_protocol::Row;

struct Mysql {
    url: String,
}

impl Sql for Conn {
    async fn execute(&mut self, sql: &str) {
        self.query_drop(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn items_of(&mut self, user: &str) -> Vec<Row> {
        self.exec::<mysql_async::Row, _, _>(
            "SELECT id, owner, value FROM items WHERE owner = ? ORDER BY id",
            (user,),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|row| read_row(row).unwrap())
        .collect()
    }

    async fn group_items_of(&mut self, user: &str) -> Vec<Row> {
        self.exec::<mysql_async::Row, _, _>(
            "SELECT id, grp, value FROM gitems WHERE grp IN \
             (SELECT grp FROM gmember WHERE user_name = ?) ORDER BY id",
            (user,),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|row| read_row(row).unwrap())
        .collect()
    }

    async fn ids(&mut self) -> Vec<i64> {
        self.query("SELECT id FROM items").await.unwrap()
    }
}

impl Database for Mysql {
    type Sql = Conn;
    type Backend = MysqlConnection;
    const HOLD_C1_SYNC_LOCK: &'static str =
        "BEGIN; INSERT IGNORE INTO rs_sync_lock (client_id) VALUES ('c1'); \
         SELECT 1 FROM rs_sync_lock WHERE client_id = 'c1' FOR UPDATE";

    async fn fresh() -> Mysql {
        let database = Mysql {
            url: rowsync_testkit::fresh_mysql_database("watermark").await,
        };
        database.connect().await.execute(ITEMS_DDL).await;
        let mut backend = database.backend().await;
        backend
            .init_table(&late_commit::items_init())
            .await
            .unwrap();
        database
    }

    async fn connect(&self) -> Conn {
        Conn::from_url(&self.url).await.unwrap()
    }

    async fn backend(&self) -> MysqlConnection {
        MysqlConsolidated::new(&self.url)
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

late_commit_tests!(Mysql);

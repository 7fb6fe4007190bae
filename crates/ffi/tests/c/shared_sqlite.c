/* An app that writes the client database with SQLite itself while librowsync syncs
 * it, in one process: each side opens and closes connections while the other's stay
 * open (tests/shared_sqlite.rs). Safe only when both call one SQLite library.
 * usage: shared_sqlite DB URL USER PASSWORD ROUNDS
 * Prints the id of every row it wrote, one a line, then "integrity=RESULT". Exit
 * status: 0, or non-zero after printing what failed. */
#include <stdio.h>
#include <stdlib.h>

#include <sqlite3.h>

#include "rowsync.h"

static const char *url, *user, *password;

static void die_rowsync(const char *what, rowsync_status status) {
    fprintf(stderr, "%s failed with status %d: %s\n", what, (int)status, rowsync_last_error());
    exit(2);
}

static void die_sqlite(const char *what, sqlite3 *db) {
    fprintf(stderr, "%s failed: %s\n", what, db ? sqlite3_errmsg(db) : "out of memory");
    exit(3);
}

static sqlite3 *app_open(const char *path) {
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK) die_sqlite("sqlite3_open", db);
    sqlite3_busy_timeout(db, 30000);
    return db;
}

static void app_exec(sqlite3 *db, const char *sql) {
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) die_sqlite(sql, db);
}

/* Inserts row r<round>-<what> and prints its id. */
static void app_write(sqlite3 *db, int round, const char *what) {
    char *sql = sqlite3_mprintf(
        "INSERT INTO orders VALUES ('r%d-%s', 'alice', '%s', %d)", round, what, what, round);
    app_exec(db, sql);
    sqlite3_free(sql);
    printf("r%d-%s\n", round, what);
}

static rowsync_client *rowsync_open_tracked(const char *path) {
    rowsync_client *client = NULL;
    rowsync_status status = rowsync_open(path, NULL, &client);
    if (status != ROWSYNC_OK) die_rowsync("rowsync_open", status);
    if ((status = rowsync_track(client, "orders")) != ROWSYNC_OK)
        die_rowsync("rowsync_track", status);
    return client;
}

static void sync_once(rowsync_client *client) {
    rowsync_options *options = NULL;
    rowsync_status status = rowsync_options_new(url, &options);
    if (status != ROWSYNC_OK) die_rowsync("rowsync_options_new", status);
    if ((status = rowsync_options_set(options, "user", user)) != ROWSYNC_OK ||
        (status = rowsync_options_set(options, "password", password)) != ROWSYNC_OK)
        die_rowsync("rowsync_options_set", status);
    rowsync_report *report = NULL;
    if ((status = rowsync_sync(client, options, NULL, NULL, &report)) != ROWSYNC_OK)
        die_rowsync("rowsync_sync", status);
    rowsync_report_free(report);
    rowsync_options_free(options);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: shared_sqlite DB URL USER PASSWORD ROUNDS\n");
        return 64;
    }
    const char *path = argv[1];
    url = argv[2];
    user = argv[3];
    password = argv[4];
    int rounds = atoi(argv[5]);

    sqlite3 *app = app_open(path);
    app_exec(app, "PRAGMA journal_mode=WAL");
    sqlite3_close(app);
    rowsync_client *client = rowsync_open_tracked(path);
    sync_once(client);
    rowsync_close(client);

    for (int round = 0; round < rounds; round++) {
        /* The app's long-lived connection, with frames in the WAL not yet checkpointed. */
        app = app_open(path);
        app_write(app, round, "held");
        /* librowsync opens, syncs and closes while the app's connection stays open. */
        client = rowsync_open_tracked(path);
        sync_once(client);
        rowsync_close(client);
        app_write(app, round, "after-close");
        /* librowsync stays open while the app's connections come and go. */
        client = rowsync_open_tracked(path);
        sqlite3 *brief = app_open(path);
        app_write(brief, round, "short");
        sqlite3_close(brief);
        sync_once(client);
        sqlite3_close(app);
        brief = app_open(path);
        app_write(brief, round, "reopened");
        sqlite3_close(brief);
        sync_once(client);
        rowsync_close(client);
    }
    client = rowsync_open_tracked(path);
    sync_once(client);
    bool pending = true;
    rowsync_status status = rowsync_pending_changes(client, &pending);
    if (status != ROWSYNC_OK) die_rowsync("rowsync_pending_changes", status);
    rowsync_close(client);
    if (pending) {
        fprintf(stderr, "changes still pending after the last sync\n");
        return 4;
    }

    app = app_open(path);
    sqlite3_stmt *check = NULL;
    if (sqlite3_prepare_v2(app, "PRAGMA integrity_check", -1, &check, NULL) != SQLITE_OK)
        die_sqlite("PRAGMA integrity_check", app);
    printf("integrity=");
    while (sqlite3_step(check) == SQLITE_ROW) printf("%s;", sqlite3_column_text(check, 0));
    printf("\n");
    sqlite3_finalize(check);
    sqlite3_close(app);
    return 0;
}

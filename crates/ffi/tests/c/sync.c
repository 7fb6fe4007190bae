/* Syncs a client database once through librowsync, written against rowsync.h only.
 * usage: sync DB URL USER PASSWORD TABLE
 * Prints the report's JSON on one line, then "progress_calls=N", then the kept conflicts'
 * JSON. Rows the table holds when first tracked are uploaded. Exit status: the
 * rowsync_status of the first call that failed. */
#include <stdio.h>
#include <stdlib.h>

#include "rowsync.h"

static void on_progress(const rowsync_progress *progress, void *user_data) {
    unsigned long *calls = user_data;
    (*calls)++;
    if (progress->rows_uploaded > progress->rows_to_upload) {
        fprintf(stderr, "progress: more rows uploaded than to upload\n");
        exit(90);
    }
}

static int fail(const char *what, rowsync_status status) {
    fprintf(stderr, "%s failed with status %d: %s\n", what, (int)status, rowsync_last_error());
    return (int)status;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: sync DB URL USER PASSWORD TABLE\n");
        return 64;
    }
    rowsync_client *client = NULL;
    rowsync_status status = rowsync_open(argv[1], NULL, &client);
    if (status != ROWSYNC_OK) return fail("rowsync_open", status);
    if (rowsync_track_with(client, argv[5], 7) != ROWSYNC_INVALID_ARGUMENT)
        return fail("an unknown rowsync_existing_rows was accepted", ROWSYNC_ERROR);
    status = rowsync_track_with(client, argv[5], ROWSYNC_EXISTING_ROWS_UPLOAD);
    if (status != ROWSYNC_OK) return fail("rowsync_track_with", status);

    rowsync_options *options = NULL;
    status = rowsync_options_new(argv[2], &options);
    if (status != ROWSYNC_OK) return fail("rowsync_options_new", status);
    if ((status = rowsync_options_set(options, "user", argv[3])) != ROWSYNC_OK ||
        (status = rowsync_options_set(options, "password", argv[4])) != ROWSYNC_OK ||
        (status = rowsync_options_set(options, "compression", "zstd")) != ROWSYNC_OK ||
        (status = rowsync_options_set_busy_retries(options, 0)) != ROWSYNC_OK)
        return fail("rowsync_options_set", status);
    if (rowsync_options_set(options, "no such option", "x") != ROWSYNC_INVALID_ARGUMENT)
        return fail("an unknown option was accepted", ROWSYNC_ERROR);

    unsigned long calls = 0;
    rowsync_report *report = NULL;
    status = rowsync_sync(client, options, on_progress, &calls, &report);
    if (status != ROWSYNC_OK) return fail("rowsync_sync", status);
    printf("%s\n", rowsync_report_json(report));
    printf("progress_calls=%lu\n", calls);
    const char *kept = NULL;
    status = rowsync_kept_conflicts(client, &kept);
    if (status != ROWSYNC_OK) return fail("rowsync_kept_conflicts", status);
    printf("%s\n", kept);

    bool pending = true;
    status = rowsync_pending_changes(client, &pending);
    if (status != ROWSYNC_OK) return fail("rowsync_pending_changes", status);
    if (pending) return fail("changes still pending after the sync", ROWSYNC_ERROR);

    rowsync_report_free(report);
    rowsync_options_free(options);
    rowsync_close(client);
    return 0;
}

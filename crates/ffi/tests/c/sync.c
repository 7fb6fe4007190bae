/* Syncs a client database once through librowsync, written against rowsync.h only.
 * usage: sync DB URL USER PASSWORD TABLE [EXTRA_TABLE]
 * Prints the report's JSON on one line, then "progress_calls=N", then the kept conflicts'
 * JSON, then the rejected changes' JSON. Rows the table holds when first tracked are
 * uploaded. EXTRA_TABLE, when given, is tracked too before the sync, untracked after it
 * ("untracked=N": its changes set aside then), and the rejected change 1 is removed
 * ("removed=0|1"). Exit status: the rowsync_status of the first call that failed. */
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
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: sync DB URL USER PASSWORD TABLE [EXTRA_TABLE]\n");
        return 64;
    }
    rowsync_client *client = NULL;
    rowsync_status status = rowsync_open(argv[1], NULL, &client);
    if (status != ROWSYNC_OK) return fail("rowsync_open", status);
    if (rowsync_track_with(client, argv[5], 7) != ROWSYNC_INVALID_ARGUMENT)
        return fail("an unknown rowsync_existing_rows was accepted", ROWSYNC_ERROR);
    status = rowsync_track_with(client, argv[5], ROWSYNC_EXISTING_ROWS_UPLOAD);
    if (status != ROWSYNC_OK) return fail("rowsync_track_with", status);
    if (argc == 7 && (status = rowsync_track(client, argv[6])) != ROWSYNC_OK)
        return fail("rowsync_track", status);

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
    const char *rejected = NULL;
    status = rowsync_rejected_rows(client, &rejected);
    if (status != ROWSYNC_OK) return fail("rowsync_rejected_rows", status);
    printf("%s\n", rejected);
    if (argc == 7) {
        uint64_t set_aside = 0;
        status = rowsync_untrack(client, argv[6], &set_aside);
        if (status != ROWSYNC_OK) return fail("rowsync_untrack", status);
        printf("untracked=%llu\n", (unsigned long long)set_aside);
        bool removed = false;
        status = rowsync_remove_rejected(client, 1, &removed);
        if (status != ROWSYNC_OK) return fail("rowsync_remove_rejected", status);
        bool requeued = true;
        status = rowsync_requeue_rejected(client, 999, &requeued);
        if (status != ROWSYNC_OK || requeued) return fail("rowsync_requeue_rejected", status);
        printf("removed=%d\n", removed ? 1 : 0);
    }

    bool pending = true;
    status = rowsync_pending_changes(client, &pending);
    if (status != ROWSYNC_OK) return fail("rowsync_pending_changes", status);
    if (pending) return fail("changes still pending after the sync", ROWSYNC_ERROR);

    rowsync_report_free(report);
    rowsync_options_free(options);
    rowsync_close(client);
    return 0;
}

package rowsync

import com.sun.jna.Pointer
import com.sun.jna.ptr.ByteByReference
import com.sun.jna.ptr.LongByReference
import com.sun.jna.ptr.PointerByReference
import java.io.File

/**
 * A client database: a SQLite file whose tracked tables sync with a rowsync server.
 * Open it with [Client.open] and [close] it when done (it is [AutoCloseable]: `use { }`).
 *
 * Calls block the calling thread (a sync until it is done: call it off Android's main
 * thread). A client may be used from any thread; calls on one client are serialized.
 *
 * One SQLite library per process (docs/client.md §11): librowsync carries its own
 * SQLite, so in the same process write the file only through [execute] while it is
 * open, not through another SQLite (sqlite-jdbc, android.database.sqlite).
 */
class Client private constructor(
    private var handle: Pointer?,
    /** The database file. */
    val path: String,
    val durability: Durability,
) : AutoCloseable {
    companion object {
        /**
         * Opens (or creates) the client database at [path]. [clientId], if given, must be
         * the database's (a random one is made on first open). [durableBeforeSync]: whether
         * every commit is made durable before an upload leaves (the default: yes; the
         * memory mode refuses false).
         */
        @JvmStatic
        @JvmOverloads
        fun open(
            path: String,
            clientId: String? = null,
            durability: Durability = Durability.FULL,
            durableBeforeSync: Boolean? = null,
        ): Client {
            val native = Lib.native
            val out = PointerByReference()
            Lib.check(native.rowsync_open_with(path, clientId, durability.native, out))
            val client = Client(out.value, path, durability)
            if (durableBeforeSync != null) {
                try {
                    client.call { native.rowsync_set_durable_before_sync(it, durableBeforeSync) }
                } catch (error: Throwable) {
                    client.close()
                    throw error
                }
            }
            return client
        }

        /** [open] with a [File]. */
        @JvmStatic
        @JvmOverloads
        fun open(
            file: File,
            clientId: String? = null,
            durability: Durability = Durability.FULL,
            durableBeforeSync: Boolean? = null,
        ): Client = open(file.path, clientId, durability, durableBeforeSync)

        /** librowsync's version, e.g. `0.1.0`. */
        @JvmStatic
        val libraryVersion: String get() = Lib.native.rowsync_version()
    }

    private val lock = Any()

    /** Set during a sync: the lock is reentrant, so only onProgress's thread sees it. */
    private var syncing = false

    /** The database's client id (a sync that finds this database copied or restored changes it). */
    val clientId: String
        get() = withHandle { Lib.native.rowsync_client_id(it).orEmpty() }

    /** Runs SQL statements (no parameters, no results) on rowsync's own connection. */
    fun execute(sql: String) = call { Lib.native.rowsync_execute(it, sql) }

    /**
     * Records every later change of [table] for upload (it needs a primary key).
     * Idempotent; call it again after changing the table's unique indexes. [existing]
     * says where the rows it holds when first tracked came from.
     */
    @JvmOverloads
    fun track(table: String, existing: ExistingRows = ExistingRows.UPLOAD) =
        call { Lib.native.rowsync_track_with(it, table, existing.native) }

    /** Stops tracking [table]; its changes not uploaded yet are set aside as rejected: how many. */
    fun untrack(table: String): Long {
        val setAside = LongByReference()
        call { Lib.native.rowsync_untrack(it, table, setAside) }
        return setAside.value
    }

    /** The next key of [table] from the key ranges the server handed this client. */
    fun nextKey(table: String): Long {
        val key = LongByReference()
        call { Lib.native.rowsync_next_key(it, table, key) }
        return key.value
    }

    /** Whether changes wait for upload. */
    fun pendingChanges(): Boolean = flag { handle, out -> Lib.native.rowsync_pending_changes(handle, out) }

    /** Makes every commit so far durable (the memory mode: copies the database to its file). */
    fun persist() = call { Lib.native.rowsync_persist(it) }

    /** The losing side of every conflict kept and not removed, oldest first. */
    fun keptConflicts(): List<KeptConflict> = withHandle {
        val out = PointerByReference()
        Lib.check(Lib.native.rowsync_kept_conflicts(it, out))
        KeptConflict.parseList(Lib.text(out))
    }

    /** Removes a kept conflict the app has dealt with; whether it was there. */
    fun removeKeptConflict(id: Long): Boolean =
        flag { handle, out -> Lib.native.rowsync_remove_kept_conflict(handle, id, out) }

    /** Changes the server refused and this client set aside, oldest first. */
    fun rejectedRows(): List<RejectedRow> = withHandle {
        val out = PointerByReference()
        Lib.check(Lib.native.rowsync_rejected_rows(it, out))
        RejectedRow.parseList(Lib.text(out))
    }

    /** Puts a rejected change back in line for the next sync; whether it was there. */
    fun requeueRejected(id: Long): Boolean =
        flag { handle, out -> Lib.native.rowsync_requeue_rejected(handle, id, out) }

    /** Removes a rejected change for good; whether it was there. */
    fun removeRejected(id: Long): Boolean =
        flag { handle, out -> Lib.native.rowsync_remove_rejected(handle, id, out) }

    /**
     * One synchronization: uploads the recorded changes and applies the download (in one
     * transaction). Conflicts are not errors: the report lists them. Throws
     * [AuthException], [RefusedException], [BusyException], [NetworkException] or
     * [RowsyncException].
     */
    fun sync(options: SyncOptions): SyncReport = withHandle { handle ->
        val relay = options.onProgress?.let(::ProgressRelay)
        options.withNative { nativeOptions ->
            val out = PointerByReference()
            syncing = true
            val status = try {
                Lib.native.rowsync_sync(handle, nativeOptions, relay, null, out)
            } finally {
                syncing = false
            }
            val failure = if (status == Lib.OK) null else Lib.lastFailure(status)
            // Read (and free) the report before anything is thrown.
            val report = if (failure == null) readReport(out.value) else null
            relay?.failure?.let { thrown ->
                failure?.let(thrown::addSuppressed)
                throw thrown
            }
            report ?: throw checkNotNull(failure)
        }
    }

    /** Closes the database and frees the native client; later calls throw [IllegalStateException]. */
    override fun close() {
        synchronized(lock) {
            check(!syncing) { "the rowsync client of $path was closed from its own sync's onProgress" }
            handle?.let { Lib.native.rowsync_close(it) }
            handle = null
        }
    }

    override fun toString(): String = "Client(path=$path, durability=$durability, open=${handle != null})"

    private fun <T> withHandle(body: (Pointer) -> T): T = synchronized(lock) {
        check(!syncing) { "the rowsync client of $path was called from its own sync's onProgress" }
        body(handle ?: throw IllegalStateException("the rowsync client of $path is closed"))
    }

    private fun call(body: (Pointer) -> Int) = withHandle { Lib.check(body(it)) }

    private fun flag(body: (Pointer, ByteByReference) -> Int): Boolean = withHandle {
        val out = ByteByReference()
        Lib.check(body(it, out))
        out.value.toInt() != 0
    }

    private fun readReport(report: Pointer): SyncReport =
        try {
            SyncReport.parse(Lib.native.rowsync_report_json(report).orEmpty())
        } finally {
            Lib.native.rowsync_report_free(report)
        }

    /** Hands each progress to the app's callback; keeps the first exception it throws. */
    private class ProgressRelay(private val onProgress: (SyncProgress) -> Unit) :
        RowsyncLibrary.ProgressCallback {
        var failure: Throwable? = null

        override fun invoke(progress: Pointer, userData: Pointer?) {
            if (failure != null) return
            try {
                onProgress(
                    SyncProgress(
                        bytesSent = progress.getLong(0),
                        bytesReceived = progress.getLong(8),
                        rowsUploaded = progress.getLong(16),
                        rowsToUpload = progress.getLong(24),
                        rowsDownloaded = progress.getLong(32),
                    ),
                )
            } catch (thrown: Throwable) {
                failure = thrown
            }
        }
    }
}

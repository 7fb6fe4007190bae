package rowsync

import com.sun.jna.Callback
import com.sun.jna.Library
import com.sun.jna.Native
import com.sun.jna.Pointer
import com.sun.jna.ptr.ByteByReference
import com.sun.jna.ptr.LongByReference
import com.sun.jna.ptr.PointerByReference

/**
 * librowsync's C ABI (crates/ffi/include/rowsync.h) as JNA maps it: every pointer the
 * library hands out is a [Pointer], every `rowsync_status` an [Int], `uint64_t` a
 * [Long] (read as unsigned where it counts), C `bool` out-parameters one byte.
 */
internal interface RowsyncLibrary : Library {
    fun rowsync_last_error(): String?
    fun rowsync_last_server_code(): Int

    fun rowsync_version(): String

    fun rowsync_open(path: String, clientId: String?, out: PointerByReference): Int

    fun rowsync_open_with(path: String, clientId: String?, durability: Int, out: PointerByReference): Int

    fun rowsync_set_durable_before_sync(client: Pointer, on: Boolean): Int

    fun rowsync_persist(client: Pointer): Int

    fun rowsync_execute(client: Pointer, sql: String): Int

    fun rowsync_close(client: Pointer?)

    fun rowsync_client_id(client: Pointer): String?

    fun rowsync_track(client: Pointer, table: String): Int

    fun rowsync_track_with(client: Pointer, table: String, existing: Int): Int

    fun rowsync_kept_conflicts(client: Pointer, out: PointerByReference): Int

    fun rowsync_remove_kept_conflict(client: Pointer, id: Long, removed: ByteByReference): Int

    fun rowsync_rejected_rows(client: Pointer, out: PointerByReference): Int

    fun rowsync_requeue_rejected(client: Pointer, id: Long, requeued: ByteByReference): Int

    fun rowsync_remove_rejected(client: Pointer, id: Long, removed: ByteByReference): Int

    fun rowsync_untrack(client: Pointer, table: String, setAside: LongByReference): Int

    fun rowsync_next_key(client: Pointer, table: String, out: LongByReference): Int

    fun rowsync_pending_changes(client: Pointer, out: ByteByReference): Int

    fun rowsync_options_new(url: String, out: PointerByReference): Int

    fun rowsync_options_free(options: Pointer?)

    fun rowsync_options_set(options: Pointer, name: String, value: String?): Int

    fun rowsync_options_set_busy_retries(options: Pointer, attemptsMax: Int): Int

    fun rowsync_options_set_download_ack(options: Pointer, enabled: Boolean): Int

    fun rowsync_options_set_timeout_ms(options: Pointer, timeoutMs: Long): Int

    fun rowsync_sync(
        client: Pointer,
        options: Pointer,
        progress: ProgressCallback?,
        userData: Pointer?,
        reportOut: PointerByReference,
    ): Int

    fun rowsync_report_free(report: Pointer?)

    fun rowsync_report_json(report: Pointer): String?

    /** `rowsync_progress_fn`: `progress` points at five `uint64_t`, valid during the call. */
    fun interface ProgressCallback : Callback {
        fun invoke(progress: Pointer, userData: Pointer?)
    }
}

/** The loaded library: `librowsync.so` (`rowsync.dll`, `librowsync.dylib`) on `jna.library.path`. */
internal object Lib {
    /** `rowsync_status` values. */
    const val OK = 0
    const val ERROR = 1
    const val INVALID_ARGUMENT = 2
    const val BUSY = 3
    const val REFUSED = 4
    const val PANIC = 5

    val native: RowsyncLibrary by lazy { load() }

    private fun load(): RowsyncLibrary =
        try {
            Native.load(
                "rowsync",
                RowsyncLibrary::class.java,
                mapOf(Library.OPTION_STRING_ENCODING to "UTF-8"),
            )
        } catch (error: UnsatisfiedLinkError) {
            throw LibraryNotFoundException(
                "librowsync could not be loaded (${error.message}); put librowsync.so on " +
                    "jna.library.path (-Djna.library.path=DIR) or in the app's native " +
                    "libraries (jniLibs/<abi>/ on Android); docs/kotlin.md",
                error,
            )
        }

    /** Throws the exception for [status] unless it is [OK], with the thread's last error. */
    fun check(status: Int) {
        if (status != OK) throw lastFailure(status)
    }

    /** The text a `const char **` out-parameter points at (owned by the library). */
    /** The exception for a failed call's [status], from this thread's last error and server code. */
    fun lastFailure(status: Int): RowsyncException =
        RowsyncException.of(status, native.rowsync_last_error().orEmpty(), native.rowsync_last_server_code())

    fun text(out: PointerByReference): String = out.value?.getString(0, "UTF-8").orEmpty()
}

package rowsync

import com.sun.jna.Pointer
import com.sun.jna.ptr.PointerByReference

/** How the client database stores commits (docs/client.md §10 says what each can lose). */
enum class Durability(internal val native: Int) {
    /** Every commit is on disk when it returns (SQLite WAL, synchronous=FULL). */
    FULL(0),

    /** Commits reach the disk at checkpoints (WAL, synchronous=NORMAL). */
    NORMAL(1),

    /** The operating system decides when (WAL, synchronous=OFF). */
    OFF(2),

    /** The database lives in memory, copied to its file before every upload and at
     *  [Client.persist]: write through [Client.execute], no other connection reaches it. */
    MEMORY(3),
}

/** Where the rows a table holds when first tracked came from. */
enum class ExistingRows(internal val native: Int) {
    /** This client's own writes: uploaded as inserts at the next sync. */
    UPLOAD(0),

    /** A copy of the server's rows (seeded by a download, shipped pre-synced): not uploaded. */
    FROM_SERVER(1),
}

/** How the sync's messages are compressed. */
enum class Compression(internal val wireName: String) {
    NONE("none"),
    ZLIB("zlib"),
    ZSTD("zstd"),
}

/**
 * Where and how to sync. [url] is `tcp://host:port`, `tls://host:port`,
 * `http://host:port/path` or `https://host:port/path`. Log in with [user] and
 * [password], or with [token] (a signed JWT). Unset values keep librowsync's defaults:
 * script version `v1`, no compression, the public web roots for TLS, a 60 s timeout,
 * busy answers retried as the server hints.
 *
 * [onProgress] is called on the syncing thread after each piece of the upload is sent
 * and each download message is applied; an exception it throws is rethrown when the
 * sync returns (the sync itself is not stopped). It must not call the syncing client
 * (that throws [IllegalStateException], which the sync then rethrows).
 */
class SyncOptions(
    val url: String,
    val user: String? = null,
    val password: String? = null,
    val token: String? = null,
    /** The script version, e.g. `v2`. */
    val version: String? = null,
    val compression: Compression? = null,
    /** PEM file of the CAs to trust instead of the web roots. */
    val caFile: String? = null,
    /** PEM files presented when the server asks for a client certificate. */
    val clientCert: String? = null,
    val clientKey: String? = null,
    /** The name the server's certificate must carry. */
    val serverName: String? = null,
    /** Sync only these tables (protocol v9). */
    val tables: List<String>? = null,
    /** Tables synced first, each level committed before the next (protocol v9). */
    val priorities: List<List<String>>? = null,
    /** Limit on connecting and on each wait for the server, in milliseconds. */
    val timeoutMs: Long? = null,
    /** Retries of a sync the server answers busy (0: [BusyException] at once). */
    val busyRetries: Int? = null,
    /** Confirm each applied download to the server in a short exchange of its own. */
    val downloadAck: Boolean = false,
    val onProgress: ((SyncProgress) -> Unit)? = null,
) {
    init {
        require(timeoutMs == null || timeoutMs >= 0) { "timeoutMs must not be negative: $timeoutMs" }
        require(busyRetries == null || busyRetries >= 0) { "busyRetries must not be negative: $busyRetries" }
    }

    private fun textOptions(): List<Pair<String, String?>> = listOf(
        "user" to user,
        "password" to password,
        "token" to token,
        "version" to version,
        "compression" to compression?.wireName,
        "ca_file" to caFile,
        "client_cert" to clientCert,
        "client_key" to clientKey,
        "server_name" to serverName,
        "tables" to tables?.joinToString(","),
        "priorities" to priorities?.joinToString(";") { it.joinToString(",") },
    )

    /** Runs [body] with these options as a native `rowsync_options`, freed after. */
    internal fun <T> withNative(body: (Pointer) -> T): T {
        val native = Lib.native
        val out = PointerByReference()
        Lib.check(native.rowsync_options_new(url, out))
        val options = out.value
        try {
            for ((name, value) in textOptions()) {
                if (value != null) Lib.check(native.rowsync_options_set(options, name, value))
            }
            timeoutMs?.let { Lib.check(native.rowsync_options_set_timeout_ms(options, it)) }
            busyRetries?.let { Lib.check(native.rowsync_options_set_busy_retries(options, it)) }
            if (downloadAck) Lib.check(native.rowsync_options_set_download_ack(options, true))
            return body(options)
        } finally {
            native.rowsync_options_free(options)
        }
    }

    override fun toString(): String =
        "SyncOptions(url=$url, user=$user, password=${password?.let { "***" }}, " +
            "token=${token?.let { "***" }}, version=$version, compression=$compression)"
}

package rowsync

/**
 * A sync or an operation on the client database failed (Python's `SyncError`). [status]
 * is the C library's `rowsync_status`; the message is its `rowsync_last_error()`.
 * Conflicts are not failures: a sync that had some succeeded and its [SyncReport] lists them.
 */
open class RowsyncException(
    message: String,
    val status: Int = Lib.ERROR,
    cause: Throwable? = null,
) : RuntimeException(message, cause) {
    companion object {
        private val CODE_NAME = Regex("""the server refused the sync: (\w+) \(code \d+\)""")
        private val NETWORK_PREFIXES = listOf(
            "network: ", "could not reach ", "timed out after ", "TLS with ", "HTTP: ",
            "the server's byte stream: ",
        )

        /**
         * The exception for a failed call's status, message and server code
         * (`rowsync_last_server_code`: -1 when the failure was not the server's answer).
         */
        internal fun of(status: Int, message: String, serverCode: Int = -1): RowsyncException = when (status) {
            Lib.INVALID_ARGUMENT -> InvalidArgumentException(message)
            Lib.BUSY -> BusyException(message)
            Lib.REFUSED -> refusal(message, serverCode.takeIf { it >= 0 })
            Lib.PANIC -> InternalException(message)
            else -> failure(status, message)
        }

        private fun refusal(message: String, code: Int?): RefusedException {
            // The code's name, for the message's reader; the code itself is the library's.
            val name = CODE_NAME.find(message)?.groupValues?.get(1)
            return if (code == AuthException.CODE) {
                AuthException(message)
            } else {
                RefusedException(message, code, name)
            }
        }

        private fun failure(status: Int, message: String): RowsyncException = when {
            message.contains("rowsync needs SQLite") -> SqliteLibraryException(message)
            NETWORK_PREFIXES.any { message.startsWith(it) } -> NetworkException(message)
            else -> RowsyncException(message, status)
        }
    }
}

/** A NULL, text that is not UTF-8, an unknown option or mode name (`ROWSYNC_INVALID_ARGUMENT`). */
class InvalidArgumentException(message: String) :
    RowsyncException(message, Lib.INVALID_ARGUMENT)

/** The server stayed busy through every retry: try again later (`ROWSYNC_BUSY`). */
class BusyException(message: String) : RowsyncException(message, Lib.BUSY)

/**
 * The server refused the sync (`ROWSYNC_REFUSED`): retrying unchanged will not help.
 * [serverCode] is the server's error code (docs/protocol.md) and [serverCodeName] its
 * name, e.g. 6 `UnknownScriptVersion`, when the message carries them.
 */
open class RefusedException(
    message: String,
    val serverCode: Int? = null,
    val serverCodeName: String? = null,
) : RowsyncException(message, Lib.REFUSED)

/** The server did not accept the user's credentials (server code 3, `AuthenticationFailed`). */
class AuthException(message: String) :
    RefusedException(message, CODE, "AuthenticationFailed") {
    companion object {
        const val CODE = 3
    }
}

/** The server could not be reached or the connection failed: network, TLS, HTTP, a timeout. */
class NetworkException(message: String) : RowsyncException(message, Lib.ERROR)

/** The SQLite library librowsync calls is older than it needs (a `system-sqlite-compat` build). */
class SqliteLibraryException(message: String) : RowsyncException(message, Lib.ERROR)

/** A bug in librowsync (`ROWSYNC_PANIC`); the client used may be unusable. */
class InternalException(message: String) : RowsyncException(message, Lib.PANIC)

/** librowsync itself could not be loaded (not on `jna.library.path`, wrong architecture). */
class LibraryNotFoundException(message: String, cause: Throwable) :
    RowsyncException(message, Lib.ERROR, cause)

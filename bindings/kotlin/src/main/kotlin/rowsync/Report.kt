package rowsync

/** How far a sync has come: bytes on the wire and rows, up and down. */
data class SyncProgress(
    val bytesSent: Long,
    val bytesReceived: Long,
    /** Upload operations sent so far, out of [rowsToUpload]. */
    val rowsUploaded: Long,
    val rowsToUpload: Long,
    /** Rows applied from the download so far. */
    val rowsDownloaded: Long,
)

/** An uploaded row the server did not take as sent, with the server's winning row. */
data class ConflictedRow(
    val table: String,
    /** The primary key's column names, in the order of [key]. */
    val keyColumns: List<String>,
    val key: List<Any?>,
    /** The server's row by column, or null when the server deleted it (or does not send the table). */
    val serverRow: Map<String, Any?>?,
)

/** What one sync did (`rowsync_report_json`). */
data class SyncReport(
    /** Upload operations the server received. */
    val rowsUploaded: Long,
    /** Rows the download changed here. */
    val rowsDownloaded: Long,
    /** Uploaded changes the server did not take as sent (it kept its own rows). */
    val conflicts: Long,
    val conflictedRows: List<ConflictedRow>,
    /** Losing changes kept in the client database ([Client.keptConflicts]). */
    val conflictsKept: Long,
    /** Changes the server refused, set aside ([Client.rejectedRows]). */
    val rowsRejected: Long,
    val rounds: Long,
    val watermark: Long,
    val elapsedSeconds: Double,
    val bytesSent: Long,
    val bytesReceived: Long,
    val busyRetries: Long,
    /** `"copied"` or `"restored"` when the server found this database was a copy or a
     *  restored backup and it took a new client id in this sync; else null. */
    val identity: String?,
    /** The report as librowsync wrote it, every field included. */
    val json: String,
) {
    internal companion object {
        fun parse(json: String): SyncReport {
            val report = Json.parse(json) as? Map<*, *> ?: throw RowsyncException("report is not an object: $json")
            fun count(name: String) = (report[name] as? Number)?.toLong() ?: 0L
            return SyncReport(
                rowsUploaded = count("rows_uploaded"),
                rowsDownloaded = count("rows_downloaded"),
                conflicts = count("conflicts"),
                conflictedRows = (report["conflicted_rows"] as? List<*>).orEmpty().map(::conflictedRow),
                conflictsKept = count("conflicts_kept"),
                rowsRejected = count("rows_rejected"),
                rounds = count("rounds"),
                watermark = count("watermark"),
                elapsedSeconds = (report["elapsed_seconds"] as? Number)?.toDouble() ?: 0.0,
                bytesSent = count("bytes_sent"),
                bytesReceived = count("bytes_received"),
                busyRetries = count("busy_retries"),
                identity = report["identity"] as? String,
                json = json,
            )
        }

        private fun conflictedRow(json: Any?): ConflictedRow {
            val row = json as Map<*, *>
            val columns = (row["columns"] as? List<*>).orEmpty().map { it as String }
            val serverValues = (row["server_row"] as? List<*>)?.map(Values::wire)
            return ConflictedRow(
                table = row["table"] as String,
                keyColumns = (row["key_columns"] as List<*>).map { it as String },
                key = (row["key"] as List<*>).map(Values::wire),
                serverRow = serverValues?.let { columns.zip(it).toMap() },
            )
        }
    }
}

/** The losing side of a conflict, kept in the client database until the app removes it. */
data class KeptConflict(
    /** For [Client.removeKeptConflict]. */
    val id: Long,
    val table: String,
    /** The losing change: `insert`, `update` or `delete`. */
    val operation: String,
    /** The primary key, column to value. */
    val key: Map<String, Any?>,
    /** The row this client uploaded (null for a delete). */
    val clientRow: Map<String, Any?>?,
    /** The server's row that won (null: the server has no such row this user may see). */
    val serverRow: Map<String, Any?>?,
    val uploadSequence: Long,
    /** When it was kept (UTC, ISO 8601). */
    val recordedAt: String,
) {
    internal companion object {
        fun parseList(json: String): List<KeptConflict> = (Json.parse(json) as List<*>).map {
            val kept = it as Map<*, *>
            KeptConflict(
                id = Values.long(kept["id"]),
                table = kept["table"] as String,
                operation = kept["operation"] as String,
                key = Values.tableRow(kept["key"]).orEmpty(),
                clientRow = Values.tableRow(kept["client_row"]),
                serverRow = Values.tableRow(kept["server_row"]),
                uploadSequence = Values.long(kept["upload_sequence"]),
                recordedAt = kept["recorded_at"] as String,
            )
        }
    }
}

/** A change the server refused; the client set it aside until the app requeues or removes it. */
data class RejectedRow(
    /** For [Client.requeueRejected] and [Client.removeRejected]. */
    val id: Long,
    val table: String,
    /** The refused change: `insert`, `update` or `delete`. */
    val operation: String,
    val key: Map<String, Any?>,
    /** The row as this client sent it (null for a delete). */
    val clientRow: Map<String, Any?>?,
    /** For an update, the row the change started from. */
    val oldRow: Map<String, Any?>?,
    /** The server's error code for the row (7: a value or table the version cannot take; 9: a script or constraint failed). */
    val code: Int,
    /** The server's reason, in its words. */
    val reason: String,
    val uploadSequence: Long,
    val recordedAt: String,
) {
    internal companion object {
        fun parseList(json: String): List<RejectedRow> = (Json.parse(json) as List<*>).map {
            val rejected = it as Map<*, *>
            RejectedRow(
                id = Values.long(rejected["id"]),
                table = rejected["table"] as String,
                operation = rejected["operation"] as String,
                key = Values.tableRow(rejected["key"]).orEmpty(),
                clientRow = Values.tableRow(rejected["client_row"]),
                oldRow = Values.tableRow(rejected["old_row"]),
                code = Values.long(rejected["code"]).toInt(),
                reason = rejected["reason"] as String,
                uploadSequence = Values.long(rejected["upload_sequence"]),
                recordedAt = rejected["recorded_at"] as String,
            )
        }
    }
}

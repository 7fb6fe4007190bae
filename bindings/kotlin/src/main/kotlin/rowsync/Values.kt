package rowsync

import java.math.BigDecimal
import java.time.LocalDate
import java.util.UUID

/**
 * Column values as Kotlin sees them. A report's conflicted rows carry the protocol's
 * typed values (`{"type": "int", "value": 1}`, docs/types.md), which become: `null`,
 * [Long] (`int`; `timestamp` in microseconds since 1970-01-01 UTC; `time` in
 * microseconds since midnight), [Double], [BigDecimal] (`decimal`), [String] (`text`;
 * `numeric` beyond a decimal, as its digits), [ByteArray] (`blob`), [Boolean], [UUID],
 * [LocalDate], [Interval], [List] (`array`). Kept conflicts and rejected changes carry
 * rows as the client's SQLite table stores them: `null`, [Long], [Double], [String],
 * [ByteArray].
 */
data class Interval(val months: Int, val days: Int, val micros: Long)

internal object Values {
    /** One protocol value in its JSON form. */
    fun wire(json: Any?): Any? {
        val typed = json as? Map<*, *> ?: throw malformed("a typed value", json)
        val value = typed["value"]
        return when (val type = typed["type"]) {
            "null" -> null
            "int", "timestamp", "time" -> long(value)
            "double" -> (value as? Number)?.toDouble() ?: Double.NaN
            "decimal" -> BigDecimal(value as String)
            "text", "numeric" -> value as String
            "blob" -> hex(value as String)
            "bool" -> value as Boolean
            "uuid" -> uuid(hex(value as String))
            "date" -> LocalDate.ofEpochDay(long(value))
            "interval" -> interval(value)
            "array" -> (value as List<*>).map { wire(it) }
            else -> throw malformed("a value type", type)
        }
    }

    /** A row of a kept conflict or a rejected change: column to value as SQLite stores it. */
    fun tableRow(json: Any?): Map<String, Any?>? {
        val row = json as? Map<*, *> ?: return null
        return row.entries.associate { (column, value) -> column as String to tableValue(value) }
    }

    private fun tableValue(json: Any?): Any? =
        if (json is Map<*, *> && json["blob"] is String) hex(json["blob"] as String) else json

    fun long(json: Any?): Long = (json as? Number)?.toLong() ?: throw malformed("an integer", json)

    private fun interval(json: Any?): Interval {
        val parts = json as? Map<*, *> ?: throw malformed("an interval", json)
        return Interval(long(parts["months"]).toInt(), long(parts["days"]).toInt(), long(parts["micros"]))
    }

    private fun uuid(bytes: ByteArray): UUID {
        val buffer = java.nio.ByteBuffer.wrap(bytes)
        return UUID(buffer.long, buffer.long)
    }

    fun hex(text: String): ByteArray =
        ByteArray(text.length / 2) { text.substring(it * 2, it * 2 + 2).toInt(16).toByte() }

    private fun malformed(what: String, json: Any?) =
        RowsyncException("librowsync's JSON has no $what where expected: $json")
}

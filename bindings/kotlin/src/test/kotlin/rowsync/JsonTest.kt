package rowsync

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.math.BigDecimal
import java.time.LocalDate
import java.util.UUID

/** The JSON reader and the value conversions, on text shaped as librowsync writes it. */
class JsonTest {
    @Test
    fun `reads objects, arrays, strings with escapes and numbers`() {
        val parsed = Json.parse(
            """ {"a": [1, -2, 3.5, 1e3], "b": "q\"\\\/\n\u00e9\ud83d\ude00", "c": true, "d": false, "e": null, "f": {}} """,
        )
        assertEquals(
            mapOf(
                "a" to listOf(1L, -2L, 3.5, 1000.0),
                "b" to "q\"\\/\n\u00e9\ud83d\ude00",
                "c" to true,
                "d" to false,
                "e" to null,
                "f" to emptyMap<String, Any?>(),
            ),
            parsed,
        )
    }

    @Test
    fun `refuses malformed text`() {
        for (text in listOf("", "{", "[1,]", "{\"a\" 1}", "\"open", "tru", "[1] 2", "{1: 2}")) {
            assertThrows<RowsyncException>(text) { Json.parse(text) }
        }
    }

    @Test
    fun `converts protocol values and table values`() {
        fun wire(json: String) = Values.wire(Json.parse(json))
        assertEquals(null, wire("""{"type": "null"}"""))
        assertEquals(7L, wire("""{"type": "int", "value": 7}"""))
        assertEquals(BigDecimal("12.50"), wire("""{"type": "decimal", "value": "12.50"}"""))
        assertArrayEquals(byteArrayOf(0, -1), wire("""{"type": "blob", "value": "00ff"}""") as ByteArray)
        assertEquals(LocalDate.of(1970, 1, 11), wire("""{"type": "date", "value": 10}"""))
        assertEquals(
            UUID.fromString("00112233-4455-6677-8899-aabbccddeeff"),
            wire("""{"type": "uuid", "value": "00112233445566778899aabbccddeeff"}"""),
        )
        assertEquals(Interval(1, 2, 3), wire("""{"type": "interval", "value": {"months": 1, "days": 2, "micros": 3}}"""))
        assertEquals(listOf(1L, "x"), wire("""{"type": "array", "value": [{"type": "int", "value": 1}, {"type": "text", "value": "x"}]}"""))
        val row = Values.tableRow(Json.parse("""{"id": 1, "photo": {"blob": "0a"}, "note": null}"""))!!
        assertEquals(1L, row["id"])
        assertArrayEquals(byteArrayOf(10), row["photo"] as ByteArray)
        assertEquals(null, row["note"])
    }
}

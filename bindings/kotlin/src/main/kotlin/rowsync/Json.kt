package rowsync

/**
 * A small reader for the JSON librowsync writes (reports, kept conflicts, rejected
 * changes): objects as [Map] (in their order), arrays as [List], strings, `true`,
 * `false`, `null`, integers as [Long] and other numbers as [Double].
 */
internal class Json private constructor(private val text: String) {
    private var at = 0

    companion object {
        fun parse(text: String): Any? {
            val reader = Json(text)
            val value = reader.value()
            reader.skipSpace()
            if (reader.at != text.length) throw reader.malformed("text after the value")
            return value
        }
    }

    private fun value(): Any? {
        skipSpace()
        if (at >= text.length) throw malformed("a value is missing")
        return when (val c = text[at]) {
            '{' -> obj()
            '[' -> array()
            '"' -> string()
            't' -> word("true", true)
            'f' -> word("false", false)
            'n' -> word("null", null)
            else -> if (c == '-' || c in '0'..'9') number() else throw malformed("unexpected '$c'")
        }
    }

    private fun obj(): Map<String, Any?> {
        val map = LinkedHashMap<String, Any?>()
        at++
        skipSpace()
        if (peek() == '}') return map.also { at++ }
        while (true) {
            skipSpace()
            if (peek() != '"') throw malformed("a key is missing")
            val key = string()
            skipSpace()
            expect(':')
            map[key] = value()
            skipSpace()
            if (peek() == '}') return map.also { at++ }
            expect(',')
        }
    }

    private fun array(): List<Any?> {
        val list = ArrayList<Any?>()
        at++
        skipSpace()
        if (peek() == ']') return list.also { at++ }
        while (true) {
            list.add(value())
            skipSpace()
            if (peek() == ']') return list.also { at++ }
            expect(',')
        }
    }

    private fun string(): String {
        val out = StringBuilder()
        at++
        while (true) {
            if (at >= text.length) throw malformed("an unterminated string")
            when (val c = text[at++]) {
                '"' -> return out.toString()
                '\\' -> out.append(escape())
                else -> out.append(c)
            }
        }
    }

    private fun escape(): Char {
        if (at >= text.length) throw malformed("an unterminated escape")
        return when (val c = text[at++]) {
            '"', '\\', '/' -> c
            'b' -> '\b'
            'f' -> '\u000C'
            'n' -> '\n'
            'r' -> '\r'
            't' -> '\t'
            'u' -> {
                if (at + 4 > text.length) throw malformed("a short \\u escape")
                text.substring(at, at + 4).toInt(16).toChar().also { at += 4 }
            }
            else -> throw malformed("the escape \\$c")
        }
    }

    private fun number(): Any {
        val start = at
        if (peek() == '-') at++
        while (at < text.length && text[at] in "0123456789.eE+-") at++
        val literal = text.substring(start, at)
        return literal.toLongOrNull()
            ?: literal.toDoubleOrNull()
            ?: throw malformed("the number $literal")
    }

    private fun word(word: String, value: Any?): Any? {
        if (!text.startsWith(word, at)) throw malformed("unexpected text")
        at += word.length
        return value
    }

    private fun expect(c: Char) {
        if (peek() != c) throw malformed("'$c' expected")
        at++
    }

    private fun peek(): Char? = if (at < text.length) text[at] else null

    private fun skipSpace() {
        while (at < text.length && text[at].isWhitespace()) at++
    }

    private fun malformed(what: String) =
        RowsyncException("malformed JSON from librowsync at offset $at: $what")
}

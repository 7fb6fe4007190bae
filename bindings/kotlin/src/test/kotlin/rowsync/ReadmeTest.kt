package rowsync

import org.jetbrains.kotlin.cli.common.ExitCode
import org.jetbrains.kotlin.cli.jvm.K2JVMCompiler
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.io.TempDir
import java.io.File
import java.nio.file.Path
import java.util.concurrent.TimeUnit

/**
 * The README's Kotlin block as written but for the server's address (as
 * bindings/python/tests/test_readme.py does for the Python block): the README's shell
 * block sets up central.db in an empty directory (every line but `rowsync serve`, which
 * this test starts on a free port), an office note is written centrally, and the block,
 * compiled with the Kotlin compiler, runs in a JVM of its own in that directory.
 */
class ReadmeTest {
    @TempDir
    lateinit var dir: Path

    private val root = File(System.getProperty("user.dir"), "../..").canonicalFile
    private val readme = File(System.getProperty("rowsync.readme") ?: File(root, "README.md").path)

    private fun blocks(language: String): List<String> =
        Regex("^```$language\\n(.*?)^```$", setOf(RegexOption.MULTILINE, RegexOption.DOT_MATCHES_ALL))
            .findAll(readme.readText()).map { it.groupValues[1] }.toList()

    @Test
    fun `the README's Kotlin block syncs`() {
        val setup = blocks("sh").first().lines().filter { "rowsync serve" !in it }.joinToString("\n")
        val path = "${File(TestServer.bin).parent}:${System.getenv("PATH")}"
        run(listOf("bash", "-euo", "pipefail", "-c", setup), mapOf("PATH" to path))
        val server = ProcessBuilder(TestServer.bin, "serve", "--db", "central.db", "--listen", "127.0.0.1:0")
            .directory(dir.toFile()).redirectError(dir.resolve("serve.log").toFile()).start()
        try {
            val address = awaitAddress(server)
            TestServer.sqlite(dir.resolve("central.db")) { db ->
                db.createStatement().use { it.execute("INSERT INTO notes VALUES ('n1', 'erin', 'from the office')") }
            }
            val block = blocks("kotlin").singleOrNull() ?: error("$readme has no one ```kotlin block")
            assertTrue(README_ADDRESS in block, block)
            val classes = compile(block.replace(README_ADDRESS, address))
            val (output, errors) = run(
                listOf(java(), "-Djna.library.path=${System.getProperty("jna.library.path")}",
                    "-cp", "$classes${File.pathSeparator}${classPath()}", "ReadmeKt"),
            )
            // rowsync's report: rows uploaded, rows downloaded, conflicted rows.
            assertEquals("0 1 []", output.lines().last { it.isNotBlank() }.substringAfterLast('\r'), output + errors)
        } finally {
            server.destroyForcibly()
            server.waitFor(10, TimeUnit.SECONDS)
        }
    }

    /** Compiles [source] (as Readme.kt) against the tests' class path; the classes' directory. */
    private fun compile(source: String): File {
        val file = dir.resolve("Readme.kt").toFile().apply { writeText(source) }
        val out = dir.resolve("readme-classes").toFile()
        val exit = K2JVMCompiler().exec(
            System.err, file.path, "-d", out.path, "-classpath", classPath(), "-no-stdlib", "-no-reflect",
            "-jvm-target", "11",
        )
        assertEquals(ExitCode.OK, exit, "the README's Kotlin block does not compile")
        return out
    }

    /** Runs [command] in the test's directory; its standard output and error. */
    private fun run(command: List<String>, env: Map<String, String> = emptyMap()): Pair<String, String> {
        val errors = dir.resolve("errors-${System.nanoTime()}.txt").toFile()
        val process = ProcessBuilder(command).directory(dir.toFile()).redirectError(errors)
            .apply { environment().putAll(env) }.start()
        val output = process.inputStream.bufferedReader().readText()
        assertTrue(process.waitFor(120, TimeUnit.SECONDS), "$command hung")
        assertEquals(0, process.exitValue(), "$command failed: $output ${errors.readText()}")
        return output to errors.readText()
    }

    private fun awaitAddress(server: Process): String {
        val log = dir.resolve("serve.log").toFile()
        repeat(1200) {
            log.readLines().firstOrNull { it.startsWith("rowsync serving") }?.let {
                return it.trim().split(" ").last().removePrefix("tcp://")
            }
            check(server.isAlive) { "rowsync serve exited: ${log.readText()}" }
            Thread.sleep(50)
        }
        error("rowsync serve printed no banner: ${log.readText()}")
    }

    private fun classPath(): String =
        System.getProperty("surefire.test.class.path") ?: System.getProperty("java.class.path")

    private fun java(): String = File(System.getProperty("java.home"), "bin/java").path

    private companion object {
        const val README_ADDRESS = "127.0.0.1:2439"
    }
}

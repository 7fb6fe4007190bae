package rowsync

import java.io.File
import java.nio.file.Files
import java.nio.file.Path
import java.sql.Connection
import java.sql.DriverManager
import java.util.concurrent.TimeUnit

/** One row of the tests' `orders` table. */
data class Order(val id: String, val rep: String, val item: String, val quantity: Long)

/**
 * A throwaway real server: a consolidated SQLite database in [dir] holding [SEED_ROWS]
 * orders of alice's, `rowsync init` on it, user alice, and `rowsync serve` on a free
 * loopback port. The binary is `ROWSYNC_BIN` (default: the checkout's
 * target/debug/rowsync).
 */
class TestServer(private val dir: Path) : AutoCloseable {
    companion object {
        const val ORDERS = "CREATE TABLE orders (id TEXT PRIMARY KEY, rep TEXT NOT NULL, " +
            "item TEXT NOT NULL, quantity INTEGER NOT NULL)"
        const val SEED_ROWS = 5_000
        const val USER = "alice"
        const val PASSWORD = "alice-password"

        private val root: File = File(System.getProperty("user.dir"), "../..").canonicalFile
        val bin: String = System.getenv("ROWSYNC_BIN") ?: File(root, "target/debug/rowsync").path

        /** Reads [path]'s alice orders (open it only while no rowsync client has it open). */
        fun orders(path: Path): List<Order> = sqlite(path) { db ->
            db.createStatement().use { statement ->
                val rows = statement.executeQuery(
                    "SELECT id, rep, item, quantity FROM orders WHERE rep = 'alice' ORDER BY id",
                )
                generateSequence { if (rows.next()) rows else null }
                    .map { Order(it.getString(1), it.getString(2), it.getString(3), it.getLong(4)) }
                    .toList()
            }
        }

        fun <T> sqlite(path: Path, body: (Connection) -> T): T =
            DriverManager.getConnection("jdbc:sqlite:$path").use(body)
    }

    val central: Path = dir.resolve("central.db")
    val url: String
    private val log: File = dir.resolve("serve.log").toFile()
    private val process: Process

    init {
        check(File(bin).canExecute()) { "no rowsync binary at $bin: build it or set ROWSYNC_BIN" }
        seed()
        run("init", "--db", central.toString(), "--table", "orders", "--partition-column", "rep")
        run("user", "add", "--db", central.toString(), "--name", USER, stdin = "$PASSWORD\n")
        process = ProcessBuilder(bin, "serve", "--db", central.toString(), "--listen", "127.0.0.1:0")
            .redirectOutput(ProcessBuilder.Redirect.DISCARD)
            .redirectError(log)
            .start()
        url = try {
            awaitBanner()
        } catch (error: Throwable) {
            close()
            throw error
        }
    }

    /** Runs SQL on the consolidated database (the server is another process: safe). */
    fun executeCentral(sql: String) = sqlite(central) { db -> db.createStatement().use { it.execute(sql) } }

    /** A new client database at [name].db with the orders table, tracked. */
    fun newClient(name: String): Pair<Client, Path> {
        val path = dir.resolve("$name.db")
        val client = Client.open(path.toString())
        try {
            client.execute(ORDERS)
            client.track("orders")
        } catch (error: Throwable) {
            client.close()
            throw error
        }
        return client to path
    }

    fun options(
        password: String = PASSWORD,
        onProgress: ((SyncProgress) -> Unit)? = null,
    ) = SyncOptions(url, user = USER, password = password, timeoutMs = 30_000, onProgress = onProgress)

    override fun close() {
        process.destroyForcibly()
        process.waitFor(10, TimeUnit.SECONDS)
    }

    private fun seed() = sqlite(central) { db ->
        db.createStatement().use { it.execute(ORDERS) }
        db.autoCommit = false
        db.prepareStatement("INSERT INTO orders VALUES (?, 'alice', 'seed', ?)").use { insert ->
            for (n in 0 until SEED_ROWS) {
                insert.setString(1, "seed-$n")
                insert.setLong(2, n.toLong())
                insert.addBatch()
            }
            insert.executeBatch()
        }
        db.commit()
    }

    private fun run(vararg args: String, stdin: String = "") {
        val process = ProcessBuilder(bin, *args).redirectErrorStream(true).start()
        process.outputStream.use { it.write(stdin.toByteArray()) }
        val output = process.inputStream.bufferedReader().readText()
        check(process.waitFor(60, TimeUnit.SECONDS)) { "rowsync ${args.joinToString(" ")} hung" }
        check(process.exitValue() == 0) { "rowsync ${args.joinToString(" ")} failed: $output" }
    }

    /** The address from `rowsync serving central.db on tcp://127.0.0.1:PORT`. */
    private fun awaitBanner(): String {
        val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
        while (System.nanoTime() < deadline) {
            val banner = Files.readAllLines(log.toPath()).firstOrNull { it.startsWith("rowsync serving") }
            if (banner != null) return banner.trim().split(" ").last()
            check(process.isAlive) { "rowsync serve exited: ${log.readText()}" }
            Thread.sleep(50)
        }
        error("rowsync serve printed no banner in 60 s: ${log.readText()}")
    }
}

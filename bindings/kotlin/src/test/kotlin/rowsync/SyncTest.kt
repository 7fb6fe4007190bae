package rowsync

import org.junit.jupiter.api.AfterEach
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeEach
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import org.junit.jupiter.api.io.TempDir
import java.nio.file.Path

/**
 * The Kotlin library against a real `rowsync serve` (TestServer): rows both ways,
 * a conflict with the server's row, typed errors, progress. Each client writes through
 * its own connection (Client.execute); the files are read back with sqlite-jdbc only
 * once the client is closed (one SQLite library per open file, docs/client.md §11).
 */
class SyncTest {
    @TempDir
    lateinit var dir: Path
    private lateinit var server: TestServer
    private val clients = mutableListOf<Client>()

    @BeforeEach
    fun start() {
        server = TestServer(dir)
    }

    @AfterEach
    fun stop() {
        clients.forEach(Client::close)
        server.close()
    }

    private fun client(name: String): Pair<Client, Path> = server.newClient(name).also { clients.add(it.first) }

    @Test
    fun `rows written on one client reach the server and another client, and central changes reach both`() {
        val (first, firstPath) = client("first")
        val (second, secondPath) = client("second")
        assertEquals(TestServer.SEED_ROWS.toLong(), first.sync(server.options()).rowsDownloaded)
        assertEquals(TestServer.SEED_ROWS.toLong(), second.sync(server.options()).rowsDownloaded)

        first.execute(
            """INSERT INTO orders VALUES ('kt-1', 'alice', 'from kotlin', 7);
               UPDATE orders SET quantity = 33 WHERE id = 'seed-3';
               DELETE FROM orders WHERE id = 'seed-4';""",
        )
        assertTrue(first.pendingChanges())
        val up = first.sync(server.options())
        assertEquals(3, up.rowsUploaded)
        assertEquals(0, up.conflicts)
        assertFalse(first.pendingChanges())

        server.executeCentral("UPDATE orders SET item = 'changed centrally' WHERE id = 'seed-9'")
        val down = second.sync(server.options())
        assertEquals(0, down.rowsUploaded)
        assertEquals(4, down.rowsDownloaded, "kt-1, seed-3, seed-4 and seed-9 changed")
        assertEquals(1, first.sync(server.options()).rowsDownloaded, "seed-9 changed centrally")

        first.close()
        second.close()
        val central = TestServer.orders(server.central)
        assertTrue(Order("kt-1", "alice", "from kotlin", 7) in central)
        assertTrue(Order("seed-3", "alice", "seed", 33) in central)
        assertTrue(central.none { it.id == "seed-4" })
        assertTrue(Order("seed-9", "alice", "changed centrally", 9) in central)
        assertEquals(TestServer.SEED_ROWS, central.size)
        assertEquals(central, TestServer.orders(firstPath))
        assertEquals(central, TestServer.orders(secondPath))
    }

    @Test
    fun `a conflict is reported with the server's row and the losing change is kept`() {
        val (first, _) = client("first")
        val (second, secondPath) = client("second")
        first.sync(server.options())
        second.sync(server.options())
        first.execute("UPDATE orders SET quantity = 1000 WHERE id = 'seed-5'")
        assertEquals(0, first.sync(server.options()).conflicts)
        second.execute("UPDATE orders SET quantity = 2000 WHERE id = 'seed-5'")

        val report = second.sync(server.options())
        assertEquals(1, report.conflicts)
        assertEquals(1, report.conflictsKept)
        val conflict = report.conflictedRows.single()
        assertEquals("orders", conflict.table)
        assertEquals(listOf("id"), conflict.keyColumns)
        assertEquals(listOf<Any?>("seed-5"), conflict.key)
        assertEquals(mapOf("id" to "seed-5", "rep" to "alice", "item" to "seed", "quantity" to 1000L), conflict.serverRow)

        val kept = second.keptConflicts().single()
        assertEquals("orders" to "update", kept.table to kept.operation)
        assertEquals(mapOf<String, Any?>("id" to "seed-5"), kept.key)
        assertEquals(2000L, kept.clientRow?.get("quantity"))
        assertEquals(1000L, kept.serverRow?.get("quantity"))
        assertTrue(second.removeKeptConflict(kept.id))
        assertFalse(second.removeKeptConflict(kept.id))
        assertEquals(emptyList<KeptConflict>(), second.keptConflicts())

        second.close()
        assertTrue(Order("seed-5", "alice", "seed", 1000) in TestServer.orders(secondPath))
        assertTrue(Order("seed-5", "alice", "seed", 1000) in TestServer.orders(server.central))
    }

    @Test
    fun `failures are typed exceptions with librowsync's message`() {
        val (client, _) = client("app")
        val auth = assertThrows<AuthException> { client.sync(server.options(password = "wrong")) }
        assertTrue("AuthenticationFailed" in auth.message!!, auth.message)
        assertTrue("wrong password" in auth.message!!, auth.message)
        assertEquals(3, auth.serverCode)
        assertEquals(Lib.REFUSED, auth.status)

        val version = SyncOptions(server.url, user = TestServer.USER, password = TestServer.PASSWORD, version = "v9")
        val refused = assertThrows<RefusedException> { client.sync(version) }
        assertFalse(refused is AuthException)
        assertEquals(6, refused.serverCode)
        assertEquals("UnknownScriptVersion", refused.serverCodeName)

        val table = assertThrows<RowsyncException> { client.track("no_such_table") }
        assertTrue("no_such_table" in table.message!!, table.message)
        val tables = SyncOptions(server.url, user = TestServer.USER, password = TestServer.PASSWORD, tables = listOf("invoices"))
        val unknown = assertThrows<RowsyncException> { client.sync(tables) }
        assertTrue("\"invoices\"" in unknown.message!!, unknown.message)

        val nowhere = SyncOptions("tcp://127.0.0.1:1", user = TestServer.USER, password = TestServer.PASSWORD)
        val network = assertThrows<NetworkException> { client.sync(nowhere) }
        assertTrue("127.0.0.1:1" in network.message!!, network.message)

        // The client still syncs after every failure. (Not counted by this report: a
        // sync after a failed one first finishes the failed one's upload in flight, with
        // that one's options, so one of the failing syncs above has already brought the rows down.)
        assertEquals(0, client.sync(server.options()).conflicts)
        assertFalse(client.pendingChanges())
        val path = dir.resolve("app.db")
        client.close()
        client.close()
        assertThrows<IllegalStateException> { client.pendingChanges() }
        assertEquals(TestServer.orders(server.central), TestServer.orders(path))
        assertEquals(TestServer.SEED_ROWS, TestServer.orders(path).size)
    }

    @Test
    fun `progress callbacks follow the download and the upload`() {
        val (client, _) = client("app")
        val down = mutableListOf<SyncProgress>()
        val threads = mutableSetOf<Thread>()
        client.sync(server.options(onProgress = { down.add(it); threads.add(Thread.currentThread()) }))
        assertTrue(down.size > 1, down.toString())
        assertEquals(setOf(Thread.currentThread()), threads, "called on the syncing thread")
        assertEquals(TestServer.SEED_ROWS.toLong(), down.last().rowsDownloaded)
        assertTrue(down.zipWithNext().all { (a, b) -> a.bytesReceived <= b.bytesReceived && a.rowsDownloaded <= b.rowsDownloaded })

        client.execute("INSERT INTO orders VALUES ('p-1', 'alice', 'x', 1), ('p-2', 'alice', 'y', 2), ('p-3', 'alice', 'z', 3)")
        val up = mutableListOf<SyncProgress>()
        assertEquals(3, client.sync(server.options(onProgress = { up.add(it) })).rowsUploaded)
        assertTrue(up.all { it.rowsToUpload == 3L && it.rowsUploaded <= 3 }, up.toString())
        assertEquals(3, up.last().rowsUploaded)
        assertTrue(up.last().bytesSent > 0)
    }

    @Test
    fun `an exception thrown by the progress callback is rethrown after the sync`() {
        val (client, _) = client("app")
        client.execute("INSERT INTO orders VALUES ('cb-1', 'alice', 'still sent', 1)")
        val thrown = assertThrows<IllegalStateException> {
            client.sync(server.options(onProgress = { throw IllegalStateException("from the callback") }))
        }
        assertEquals("from the callback", thrown.message)
        assertFalse(client.pendingChanges())
        assertTrue(Order("cb-1", "alice", "still sent", 1) in TestServer.orders(server.central))

        client.execute("INSERT INTO orders VALUES ('cb-2', 'alice', 'also sent', 2)")
        val reentered = assertThrows<IllegalStateException> {
            client.sync(server.options(onProgress = { client.pendingChanges() }))
        }
        assertTrue("onProgress" in reentered.message!!, reentered.message)
        assertFalse(client.pendingChanges())
    }

    @Test
    fun `the memory mode syncs and persists its writes to the file`() {
        val path = dir.resolve("memory.db")
        Client.open(path.toString(), durability = Durability.MEMORY).use { client ->
            assertEquals(Durability.MEMORY, client.durability)
            val id = client.clientId
            assertTrue(id.isNotEmpty())
            client.execute(TestServer.ORDERS)
            client.track("orders")
            client.execute("INSERT INTO orders VALUES ('mem-1', 'alice', 'in memory', 1)")
            val report = client.sync(server.options())
            assertEquals(1L to TestServer.SEED_ROWS.toLong(), report.rowsUploaded to report.rowsDownloaded)
            assertNull(report.identity)
            client.persist()
            assertEquals(id, client.clientId)
        }
        assertTrue(Order("mem-1", "alice", "in memory", 1) in TestServer.orders(path))
        assertTrue(Order("mem-1", "alice", "in memory", 1) in TestServer.orders(server.central))
        assertThrows<RowsyncException> {
            Client.open(dir.resolve("m.db").toString(), durability = Durability.MEMORY, durableBeforeSync = false)
        }
        Client.open(path.toString()).use { reopened -> assertNotEquals("", reopened.clientId) }
    }
}

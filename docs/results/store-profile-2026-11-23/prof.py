import sqlite3, time, os, sys, random
NA = "(SELECT applying_download FROM rs_client_state WHERE id = 1) = 0"
STATE = """CREATE TABLE rs_client_state (id INTEGER PRIMARY KEY CHECK (id = 1), client_id TEXT NOT NULL,
 upload_sequence_acknowledged INTEGER NOT NULL DEFAULT 0, download_watermark INTEGER NOT NULL DEFAULT 0,
 applying_download INTEGER NOT NULL DEFAULT 0); INSERT INTO rs_client_state (id, client_id) VALUES (1, 'x');"""
KV = "CREATE TABLE kv (k BLOB PRIMARY KEY, owner TEXT NOT NULL, v BLOB NOT NULL) WITHOUT ROWID;"
LOG = 'CREATE TABLE rs_log_kv ("k", rs_op TEXT NOT NULL, "rs_old_k", "rs_old_owner", "rs_old_v", PRIMARY KEY ("k")) WITHOUT ROWID;'
DEL_SET = "ON CONFLICT (\"k\") DO UPDATE SET rs_op = CASE rs_op WHEN 'I' THEN 'X' WHEN 'X' THEN 'X' ELSE 'D' END"
def triggers(na=NA, displace=True, merged_update=False):
    t = []
    if displace:
        t.append(f"""CREATE TRIGGER d_i BEFORE INSERT ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") SELECT t.k, 'D', t.k, t.owner, t.v FROM kv AS t WHERE t.k = NEW.k {DEL_SET}; END;""")
        t.append(f"""CREATE TRIGGER d_u BEFORE UPDATE OF "k" ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") SELECT t.k, 'D', t.k, t.owner, t.v FROM kv AS t WHERE t.k = NEW.k AND NOT (t.k = OLD.k) {DEL_SET}; END;""")
    t.append(f"""CREATE TRIGGER i AFTER INSERT ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op) VALUES (NEW.k, 'I') ON CONFLICT ("k") DO UPDATE SET rs_op = CASE rs_op WHEN 'D' THEN 'U' WHEN 'X' THEN 'I' ELSE rs_op END; END;""")
    t.append(f"""CREATE TRIGGER u AFTER UPDATE ON kv WHEN {na} AND NOT (OLD.k IS NOT NEW.k) BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") VALUES (NEW.k, 'U', OLD.k, OLD.owner, OLD.v) ON CONFLICT ("k") DO NOTHING; END;""")
    t.append(f"""CREATE TRIGGER r AFTER UPDATE ON kv WHEN {na} AND (OLD.k IS NOT NEW.k) BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") VALUES (OLD.k, 'D', OLD.k, OLD.owner, OLD.v) {DEL_SET};
 INSERT INTO rs_log_kv ("k", rs_op) VALUES (NEW.k, 'I') ON CONFLICT ("k") DO UPDATE SET rs_op = CASE rs_op WHEN 'D' THEN 'U' WHEN 'X' THEN 'I' ELSE rs_op END; END;""")
    t.append(f"""CREATE TRIGGER dl AFTER DELETE ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") VALUES (OLD.k, 'D', OLD.k, OLD.owner, OLD.v) {DEL_SET}; END;""")
    return "\n".join(t)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
def key(n): return bytes(56) + n.to_bytes(8, 'big')
def run(label, ddl):
    path = f"/tmp/store-prof/{label}.db"
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f): os.remove(f)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=OFF")
    c.executescript(STATE + KV + ddl)
    batches = list(range(N // 10)); random.Random(1).shuffle(batches)
    res = {}
    for phase, sql in [("insert", "INSERT INTO kv VALUES (?, 'bench', ?)"), ("update", "UPDATE kv SET v = ? WHERE k = ?"), ("delete", "DELETE FROM kv WHERE k = ?")]:
        t0 = time.perf_counter()
        for b in batches:
            c.execute("BEGIN IMMEDIATE")
            for n in range(b * 10, b * 10 + 10):
                if phase == "insert": c.execute(sql, (key(n), bytes(64)))
                elif phase == "update": c.execute(sql, (bytes([1]) * 64, key(n)))
                else: c.execute(sql, (key(n),))
            c.execute("COMMIT")
        res[phase] = N / (time.perf_counter() - t0)
        if "rs_log_kv" in ddl: c.execute("DELETE FROM rs_log_kv")
    return res
base = run("untracked", "")
print("untracked", {k: round(v) for k, v in base.items()})
for label, ddl in [("tracked", LOG + triggers()), ("no_when", LOG + triggers(na="1")), ("no_displace", LOG + triggers(displace=False)), ("no_when_no_displace", LOG + triggers(na="1", displace=False))]:
    r = run(label, ddl)
    print(f"{label:22}", {k: f"{round(v)} x{base[k]/v:.2f}" for k, v in r.items()})

import sqlite3, sys
exec(open("prof.py").read().split("N = int(")[0])
variant, upto, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
def key(n): return bytes(56) + n.to_bytes(8, 'big')
def merged(na=NA):
    t = triggers(na=na).split("CREATE TRIGGER")
    keep = [x for x in t if x.strip() and not x.startswith(" u ") and not x.startswith(" r ")]
    m = f""" m AFTER UPDATE ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") SELECT NEW.k, 'U', OLD.k, OLD.owner, OLD.v WHERE OLD.k IS NEW.k ON CONFLICT ("k") DO NOTHING;
 INSERT INTO rs_log_kv ("k", rs_op, "rs_old_k", "rs_old_owner", "rs_old_v") SELECT OLD.k, 'D', OLD.k, OLD.owner, OLD.v WHERE OLD.k IS NOT NEW.k {DEL_SET};
 INSERT INTO rs_log_kv ("k", rs_op) SELECT NEW.k, 'I' WHERE OLD.k IS NOT NEW.k ON CONFLICT ("k") DO UPDATE SET rs_op = CASE rs_op WHEN 'D' THEN 'U' WHEN 'X' THEN 'I' ELSE rs_op END; END;"""
    return "CREATE TRIGGER".join([""] + keep + [m])
ddl = {"untracked": "", "tracked": LOG + triggers(), "no_when": LOG + triggers(na="1"),
       "no_displace": LOG + triggers(displace=False), "merged": LOG + merged(),
       "exists_flag": "CREATE TABLE rs_client_applying (x);" + LOG + triggers(na="NOT EXISTS (SELECT 1 FROM rs_client_applying)"),
       "no_trig_insert_only": LOG}[variant]
c = sqlite3.connect(":memory:", isolation_level=None)
c.executescript(STATE + KV + ddl)
phases = ["insert", "update", "delete"]
for phase in phases[: phases.index(upto) + 1]:
    sql = {"insert": "INSERT INTO kv VALUES (?, 'bench', ?)", "update": "UPDATE kv SET v = ? WHERE k = ?", "delete": "DELETE FROM kv WHERE k = ?"}[phase]
    for b in range(N // 10):
        c.execute("BEGIN IMMEDIATE")
        for n in range(b * 10, b * 10 + 10):
            if phase == "insert": c.execute(sql, (key(n), bytes(64)))
            elif phase == "update": c.execute(sql, (bytes([1]) * 64, key(n)))
            else: c.execute(sql, (key(n),))
        c.execute("COMMIT")
    if "rs_log_kv" in ddl: c.execute("DELETE FROM rs_log_kv")

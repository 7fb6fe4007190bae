import sqlite3, sys
exec(open("prof.py").read().split("N = int(")[0])
variant, upto, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
def key(n): return bytes(56) + n.to_bytes(8, 'big')
INS_SET = "ON CONFLICT (\"k\") DO UPDATE SET rs_op = CASE rs_op WHEN 'D' THEN 'U' WHEN 'X' THEN 'I' ELSE rs_op END"
def new_triggers(lean=True, rekey_of=True, merged_insert=False, na=NA):
    oc = '"rs_old_owner", "rs_old_v"' if lean else '"rs_old_k", "rs_old_owner", "rs_old_v"'
    im = (lambda a: f"{a}.owner, {a}.v") if lean else (lambda a: f"{a}.k, {a}.owner, {a}.v")
    log = f'CREATE TABLE rs_log_kv ("k", rs_op TEXT NOT NULL, {oc}, PRIMARY KEY ("k")) WITHOUT ROWID;'
    t = [log]
    if merged_insert:
        t.append(f"""CREATE TRIGGER d_i BEFORE INSERT ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, {oc}) SELECT NEW.k, iif(t.k IS NULL, 'I', 'U'), {im('t')} FROM (SELECT 1) LEFT JOIN kv AS t ON t.k = NEW.k WHERE true {INS_SET}; END;""")
    else:
        t.append(f"""CREATE TRIGGER d_i BEFORE INSERT ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, {oc}) SELECT t.k, 'D', {im('t')} FROM kv AS t WHERE t.k = NEW.k {DEL_SET}; END;""")
        t.append(f"""CREATE TRIGGER i AFTER INSERT ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op) VALUES (NEW.k, 'I') {INS_SET}; END;""")
    t.append(f"""CREATE TRIGGER d_u BEFORE UPDATE OF "k" ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, {oc}) SELECT t.k, 'D', {im('t')} FROM kv AS t WHERE t.k = NEW.k AND NOT (t.k = OLD.k) {DEL_SET}; END;""")
    t.append(f"""CREATE TRIGGER u AFTER UPDATE ON kv WHEN {na} AND NOT (OLD.k IS NOT NEW.k) BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, {oc}) VALUES (NEW.k, 'U', {im('OLD')}) ON CONFLICT ("k") DO NOTHING; END;""")
    t.append(f"""CREATE TRIGGER r AFTER UPDATE {'OF "k"' if rekey_of else ''} ON kv WHEN {na} AND (OLD.k IS NOT NEW.k) BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, {oc}) VALUES (OLD.k, 'D', {im('OLD')}) {DEL_SET};
 INSERT INTO rs_log_kv ("k", rs_op) VALUES (NEW.k, 'I') {INS_SET}; END;""")
    t.append(f"""CREATE TRIGGER dl AFTER DELETE ON kv WHEN {na} BEGIN
 INSERT INTO rs_log_kv ("k", rs_op, {oc}) VALUES (OLD.k, 'D', {im('OLD')}) {DEL_SET}; END;""")
    return "\n".join(t)
ddl = {"untracked": "", "tracked": LOG + triggers(),
       "lean": new_triggers(rekey_of=False), "rekey_of": new_triggers(lean=False),
       "lean_rekey_of": new_triggers(), "lean_rekey_of_merged": new_triggers(merged_insert=True)}[variant]
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

//! The SQLite functions rusqlite 0.41 calls that older libraries lack, so the extension
//! loads with the interpreter's libsqlite3 as far back as [`crate::sqlite::MIN_VERSION`]
//! (Debian 12 has 3.40.1, Ubuntu 22.04 3.37.2; rusqlite 0.41 calls 3.44's client
//! data functions). Defined here, these names are what the extension's calls bind to; each
//! forwards to the library's own function when it has one (looked up once in the very
//! library `sqlite3_libversion` came from), and otherwise does what rowsync needs:
//!
//! * `sqlite3_changes64` (3.37.0): `sqlite3_changes`, exact below 2^31 rows;
//! * `sqlite3_error_offset` (3.38.0): -1, "no offset" (only error messages use it);
//! * `sqlite3_set_clientdata` / `sqlite3_get_clientdata` (3.44.0): a table by
//!   connection and name. rusqlite keeps its callbacks there (busy handler, trace,
//!   hooks); rowsync installs none, and only clears the busy handler's slot (every
//!   `busy_timeout`), so nothing is ever kept. Were a callback kept, this table could
//!   not run its destructor when the connection closes (SQLite does, there).
//!
//! Unix only: elsewhere the extension needs a SQLite of at least 3.44.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

use rusqlite::ffi::{self, sqlite3, sqlite3_int64};

type Destructor = Option<unsafe extern "C" fn(*mut c_void)>;

/// The library's own `name`, if it has one: looked up in the object that defines the
/// `sqlite3_libversion` the extension calls, never in the extension itself.
fn own(name: &CStr) -> Option<usize> {
    let version = ffi::sqlite3_libversion as *const c_void;
    // SAFETY: dladdr and dlsym only read the loader's tables; dlopen with RTLD_NOLOAD
    // takes a reference to an object already loaded (dropped by dlclose).
    unsafe {
        let mut library: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(version, &mut library) == 0 || library.dli_fname.is_null() {
            return None;
        }
        let mut handle = libc::dlopen(library.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        let opened = !handle.is_null();
        if !opened {
            handle = libc::RTLD_DEFAULT;
        }
        let symbol = libc::dlsym(handle, name.as_ptr());
        if opened {
            libc::dlclose(handle);
        }
        let mut found: libc::Dl_info = std::mem::zeroed();
        let same_object = !symbol.is_null()
            && libc::dladdr(symbol, &mut found) != 0
            && found.dli_fbase == library.dli_fbase;
        same_object.then_some(symbol as usize)
    }
}

macro_rules! own_function {
    ($name:literal, $type:ty) => {{
        static FOUND: OnceLock<Option<usize>> = OnceLock::new();
        // SAFETY: the symbol of that name in SQLite has this C signature.
        FOUND
            .get_or_init(|| own($name))
            .map(|address| unsafe { std::mem::transmute::<usize, $type>(address) })
    }};
}

/// # Safety
/// As SQLite's: `db` is an open connection.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_changes64(db: *mut sqlite3) -> sqlite3_int64 {
    match own_function!(
        c"sqlite3_changes64",
        unsafe extern "C" fn(*mut sqlite3) -> sqlite3_int64
    ) {
        Some(changes64) => unsafe { changes64(db) },
        None => sqlite3_int64::from(unsafe { ffi::sqlite3_changes(db) }),
    }
}

/// # Safety
/// As SQLite's: `db` is an open connection.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_error_offset(db: *mut sqlite3) -> c_int {
    match own_function!(
        c"sqlite3_error_offset",
        unsafe extern "C" fn(*mut sqlite3) -> c_int
    ) {
        Some(error_offset) => unsafe { error_offset(db) },
        None => -1,
    }
}

/// Client data by (connection, name): the pointer and its destructor, as addresses.
type ClientData = HashMap<(usize, CString), (usize, Destructor)>;

fn client_data() -> &'static Mutex<ClientData> {
    static TABLE: OnceLock<Mutex<ClientData>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// # Safety
/// As SQLite's: `db` is an open connection, `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_set_clientdata(
    db: *mut sqlite3,
    name: *const c_char,
    data: *mut c_void,
    destructor: Destructor,
) -> c_int {
    type SetClientData =
        unsafe extern "C" fn(*mut sqlite3, *const c_char, *mut c_void, Destructor) -> c_int;
    if let Some(set) = own_function!(c"sqlite3_set_clientdata", SetClientData) {
        return unsafe { set(db, name, data, destructor) };
    }
    let key = (db as usize, unsafe { CStr::from_ptr(name) }.to_owned());
    let previous = {
        let mut table = client_data()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if data.is_null() {
            table.remove(&key)
        } else {
            table.insert(key, (data as usize, destructor))
        }
    };
    // SQLite runs the destructor of the value replaced.
    if let Some((previous, Some(destructor))) = previous {
        unsafe { destructor(previous as *mut c_void) };
    }
    ffi::SQLITE_OK
}

/// # Safety
/// As SQLite's: `db` is an open connection, `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_get_clientdata(
    db: *mut sqlite3,
    name: *const c_char,
) -> *mut c_void {
    type GetClientData = unsafe extern "C" fn(*mut sqlite3, *const c_char) -> *mut c_void;
    if let Some(get) = own_function!(c"sqlite3_get_clientdata", GetClientData) {
        return unsafe { get(db, name) };
    }
    let key = (db as usize, unsafe { CStr::from_ptr(name) }.to_owned());
    let table = client_data()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    table
        .get(&key)
        .map_or(std::ptr::null_mut(), |&(data, _)| data as *mut c_void)
}

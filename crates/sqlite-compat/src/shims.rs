//! The definitions (see the crate's documentation).

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

/// # Safety
/// As SQLite's: `db` is an open connection.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_db_name(db: *mut sqlite3, n: c_int) -> *const c_char {
    type DbName = unsafe extern "C" fn(*mut sqlite3, c_int) -> *const c_char;
    match own_function!(c"sqlite3_db_name", DbName) {
        Some(db_name) => unsafe { db_name(db, n) },
        None => std::ptr::null(),
    }
}

/// # Safety
/// As SQLite's: `db` is an open connection.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_is_interrupted(db: *mut sqlite3) -> c_int {
    match own_function!(
        c"sqlite3_is_interrupted",
        unsafe extern "C" fn(*mut sqlite3) -> c_int
    ) {
        Some(is_interrupted) => unsafe { is_interrupted(db) },
        None => 0,
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

//! The published figures of "Oracle Berkeley DB 11g Release 2 Performance Overview"
//! (July 2010; Intel Core 2 Duo E8400 3.00 GHz, 4 GB, SATA 7200 RPM, ext3): other
//! hardware and another store, printed beside ours for scale only.

pub const LABEL: &str =
    "Berkeley DB 11gR2, published (other hardware: Core 2 Duo E8400, SATA 7200 RPM)";

/// A row of Tables 4 and 5: operations per second (mean, standard deviation).
pub struct KvRow {
    pub label: &'static str,
    pub insert: (f64, f64),
    pub fetch: (f64, f64),
    pub delete: (f64, f64),
    pub update: (f64, f64),
}

/// Table 4: Transactional Data Store, one thread, by durability setting. The mode of
/// ours that each row corresponds to is named in its label.
pub const TABLE_4: [KvRow; 5] = [
    KvRow {
        label: "TDS SYNC (full)",
        insert: (693.0, 10.0),
        fetch: (159_837.0, 895.0),
        delete: (831.0, 23.0),
        update: (1_732.0, 18.0),
    },
    KvRow {
        label: "TDS RAMDISK (full, RAM disk)",
        insert: (49_673.0, 912.0),
        fetch: (162_848.0, 1_588.0),
        delete: (44_279.0, 277.0),
        update: (60_973.0, 291.0),
    },
    KvRow {
        label: "TDS WNS (normal)",
        insert: (37_664.0, 460.0),
        fetch: (160_307.0, 293.0),
        delete: (36_110.0, 454.0),
        update: (52_922.0, 258.0),
    },
    KvRow {
        label: "TDS NS (off)",
        insert: (53_199.0, 613.0),
        fetch: (159_980.0, 1_419.0),
        delete: (49_340.0, 183.0),
        update: (86_960.0, 639.0),
    },
    KvRow {
        label: "TDS INMEM (memory)",
        insert: (66_435.0, 102.0),
        fetch: (163_229.0, 815.0),
        delete: (58_845.0, 101.0),
        update: (97_602.0, 396.0),
    },
];

/// Table 3: Data Store (no transactions, no log), one thread.
pub const TABLE_3: KvRow = KvRow {
    label: "DS (no transactions)",
    insert: (208_139.0, 329.0),
    fetch: (264_665.0, 229.0),
    delete: (158_506.0, 236.0),
    update: (250_297.0, 870.0),
};

/// Table 5: TDS with synchronous commits by thread count: (threads, insert, fetch,
/// delete, update) in operations per second.
pub const TABLE_5: [(usize, f64, f64, f64, f64); 7] = [
    (1, 693.0, 159_837.0, 831.0, 1_732.0),
    (2, 647.0, 106_196.0, 767.0, 1_634.0),
    (3, 690.0, 126_762.0, 863.0, 1_909.0),
    (4, 721.0, 134_581.0, 882.0, 2_085.0),
    (8, 859.0, 128_928.0, 967.0, 2_497.0),
    (12, 930.0, 112_735.0, 1_013.0, 2_658.0),
    (16, 968.0, 99_860.0, 1_085.0, 2_837.0),
];

/// Table 6: TPC-B-like transactions per second by worker threads.
pub const TABLE_6: [(usize, f64); 6] = [
    (1, 1_846.71),
    (2, 2_310.84),
    (3, 2_508.26),
    (4, 2_678.14),
    (5, 2_808.51),
    (10, 2_859.15),
];

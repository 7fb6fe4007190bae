//! The MobiLink 12 performance white paper's published figures (Tables 2 to 16), as
//! printed there, for orientation beside rowsync's own measurements.
//!
//! The paper measured MobiLink 12 with SQL Anywhere on two 12-core servers and ten client
//! machines; rowsync's numbers come from other hardware and another database, so the
//! report always prints these under [`PUBLISHED_LABEL`] and never compares them as equals.

/// The label printed above every published table.
pub const PUBLISHED_LABEL: &str = "published: MobiLink 12 / SQL Anywhere on other hardware \
(two 12-core servers, ten client machines), for orientation only";

/// What a published table's cells count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Total server time in seconds (one decimal in the paper).
    Seconds,
    /// Relative standard deviation in percent.
    Percent,
    /// Number of client retries (refused synchronizations).
    Retries,
}

/// One row of a published table: the varied parameter's value, then Download, Update,
/// Delete, Insert, and the paper's own Sum column where it printed one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperRow {
    pub label: &'static str,
    /// Download, Update, Delete, Insert (the paper's column order, as [`super::results::SYNC_TYPES`]).
    pub values: [f64; 4],
    /// The published Sum; it can differ from the sum of the rounded cells by 0.1.
    pub sum: Option<f64>,
}

/// One of the paper's tables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperTable {
    pub number: u8,
    /// The caption as printed, without the "Table N:" prefix.
    pub caption: &'static str,
    /// The first column's header as printed.
    pub parameter: &'static str,
    pub unit: Unit,
    pub rows: &'static [PaperRow],
}

impl PaperTable {
    /// The row whose first column reads `label`.
    pub fn row(&self, label: &str) -> Option<&'static PaperRow> {
        self.rows.iter().find(|row| row.label == label)
    }
}

/// The published tables that belong to one of the paper's five tests (empty for any other
/// number): Test 1 = Tables 2-4, Test 2 = 5-8, Test 3 = 9-10, Test 4 = 11, Test 5 = 12-16.
pub fn published_for(test: u8) -> &'static [PaperTable] {
    match test {
        1 => &TEST_1,
        2 => &TEST_2,
        3 => &TEST_3,
        4 => &TEST_4,
        5 => &TEST_5,
        _ => &[],
    }
}

/// Every transcribed table, Tables 2 to 16 in order.
pub fn all_tables() -> impl Iterator<Item = &'static PaperTable> {
    (1..=5).flat_map(published_for)
}

const TEST_1: [PaperTable; 3] = [TABLE_2, TABLE_3, TABLE_4];
const TEST_2: [PaperTable; 4] = [TABLE_5, TABLE_6, TABLE_7, TABLE_8];
const TEST_3: [PaperTable; 2] = [TABLE_9, TABLE_10];
const TEST_4: [PaperTable; 1] = [TABLE_11];
const TEST_5: [PaperTable; 5] = [TABLE_12, TABLE_13, TABLE_14, TABLE_15, TABLE_16];

const fn row(label: &'static str, values: [f64; 4], sum: Option<f64>) -> PaperRow {
    PaperRow { label, values, sum }
}

const TABLE_2: PaperTable = PaperTable {
    number: 2,
    caption: "Total server time (in seconds) vs. fixed number of MobiLink database worker threads.",
    parameter: "DB Workers",
    unit: Unit::Seconds,
    rows: &[
        row("5", [47.0, 786.5, 547.9, 223.2], Some(1604.6)),
        row("10", [31.9, 362.9, 270.4, 145.4], Some(810.5)),
        row("20", [25.1, 215.5, 167.3, 111.0], Some(518.9)),
        row("50", [26.5, 152.7, 109.1, 102.8], Some(391.0)),
        row("70", [26.7, 149.7, 101.1, 103.3], Some(380.8)),
        row("75", [26.3, 148.9, 102.7, 102.6], Some(380.5)),
        row("80", [26.0, 149.1, 102.8, 103.1], Some(381.0)),
        row("90", [25.1, 151.6, 102.4, 103.4], Some(382.5)),
        row("100", [25.4, 153.0, 101.6, 103.6], Some(383.6)),
        row("200", [26.2, 154.4, 105.1, 103.8], Some(389.4)),
    ],
};

const TABLE_3: PaperTable = PaperTable {
    number: 3,
    caption: "Best total server times from 5 runs with different database worker thread options.",
    parameter: "DB Worker Option",
    unit: Unit::Seconds,
    rows: &[
        row("Auto 5-100", [24.6, 175.3, 107.0, 102.5], None),
        row("Auto 25-100", [25.0, 154.9, 103.0, 102.4], None),
        row("Auto 50-100", [26.9, 148.7, 102.7, 102.4], None),
        row("Fixed 75", [25.8, 148.9, 102.3, 102.6], None),
        row("Fixed 100", [25.4, 151.4, 100.8, 103.1], None),
    ],
};

const TABLE_4: PaperTable = PaperTable {
    number: 4,
    caption:
        "Relative standard deviations from 5 runs with different database worker thread options.",
    parameter: "DB Worker Option",
    unit: Unit::Percent,
    rows: &[
        row("Auto 5-100", [4.5, 10.8, 5.2, 0.9], None),
        row("Auto 25-100", [2.0, 5.7, 15.6, 0.9], None),
        row("Auto 50-100", [1.7, 1.0, 3.1, 0.5], None),
        row("Fixed 75", [1.7, 0.9, 1.1, 0.6], None),
        row("Fixed 100", [2.5, 0.5, 0.6, 0.3], None),
    ],
};

const TABLE_5: PaperTable = PaperTable {
    number: 5,
    caption: "Total server time (in seconds) vs. retry delay for 10000 clients with default connection limit of 1024.",
    parameter: "Retry Delay",
    unit: Unit::Seconds,
    rows: &[
        row("0", [180.7, 510.7, 107.0, 34.7], Some(833.0)),
        row("0.5", [106.7, 354.2, 76.4, 33.3], Some(570.7)),
        row("1", [99.7, 295.0, 69.6, 34.3], Some(498.6)),
        row("2", [95.1, 208.0, 60.3, 34.3], Some(397.6)),
        row("5", [118.2, 131.1, 59.4, 35.8], Some(344.6)),
        row("10", [165.9, 102.7, 77.7, 56.7], Some(403.0)),
        row("20", [194.0, 117.6, 132.9, 107.1], Some(551.6)),
        row("50", [465.0, 229.0, 359.0, 256.5], Some(1309.4)),
    ],
};

const TABLE_6: PaperTable = PaperTable {
    number: 6,
    caption: "Number of retries vs. the retry delay for 10000 clients with default connection limit of 1024.",
    parameter: "Retry Delay",
    unit: Unit::Retries,
    rows: &[
        row("0", [714616.0, 364457.0, 291695.0, 81744.0], None),
        row("0.5", [338340.0, 234931.0, 179385.0, 75210.0], None),
        row("1", [257282.0, 194344.0, 146663.0, 66810.0], None),
        row("2", [165317.0, 126472.0, 95042.0, 49594.0], None),
        row("5", [88830.0, 63106.0, 42950.0, 21434.0], None),
        row("10", [68530.0, 29433.0, 29558.0, 18663.0], None),
        row("20", [41289.0, 21418.0, 30475.0, 18522.0], None),
        row("50", [42236.0, 22664.0, 30134.0, 18007.0], None),
    ],
};

const TABLE_7: PaperTable = PaperTable {
    number: 7,
    caption: "Total server time (in seconds) vs. retry delay for 10000 clients with connection limit of 10000.",
    parameter: "Retry Delay",
    unit: Unit::Seconds,
    rows: &[
        row("0", [21.5, 92.2, 58.5, 34.0], Some(206.2)),
        row("0.1", [21.4, 92.5, 58.4, 33.7], Some(205.9)),
        row("0.2", [21.3, 92.3, 58.3, 33.8], Some(205.7)),
        row("0.5", [23.9, 93.0, 58.5, 33.7], Some(209.1)),
        row("1", [23.0, 92.3, 59.4, 34.2], Some(208.9)),
        row("2", [23.2, 88.1, 57.8, 34.6], Some(203.7)),
        row("5", [26.7, 91.2, 58.0, 33.2], Some(209.2)),
        row("10", [27.7, 91.0, 59.8, 33.9], Some(212.4)),
        row("20", [36.0, 92.1, 59.1, 37.7], Some(224.9)),
        row("50", [105.7, 94.1, 107.9, 68.1], Some(375.8)),
    ],
};

const TABLE_8: PaperTable = PaperTable {
    number: 8,
    caption:
        "Number of retries vs. the retry delay for 10000 clients with connection limit of 10000.",
    parameter: "Retry Delay",
    unit: Unit::Retries,
    rows: &[
        row("0", [13842.0, 8260.0, 12543.0, 9238.0], None),
        row("0.1", [11637.0, 9719.0, 7597.0, 8173.0], None),
        row("0.2", [10500.0, 7744.0, 5403.0, 7256.0], None),
        row("0.5", [9322.0, 4614.0, 5857.0, 5052.0], None),
        row("1", [10787.0, 11940.0, 9306.0, 8858.0], None),
        row("2", [7190.0, 9290.0, 4709.0, 5180.0], None),
        row("5", [6315.0, 4173.0, 4481.0, 5999.0], None),
        row("10", [3451.0, 3564.0, 3457.0, 3373.0], None),
        row("20", [3262.0, 1575.0, 3673.0, 3202.0], None),
        row("50", [4200.0, 1907.0, 4744.0, 3789.0], None),
    ],
};

const TABLE_9: PaperTable = PaperTable {
    number: 9,
    caption: "Total server time (in seconds) vs. number of clients. The connection limit was the default of 1024 and the retry delay was 5 seconds.",
    parameter: "Number of Clients",
    unit: Unit::Seconds,
    rows: &[
        row("200", [39.3, 239.7, 246.7, 193.5], None),
        row("500", [30.6, 177.1, 137.9, 128.7], None),
        row("1000", [26.0, 150.2, 102.7, 103.5], None),
        row("2000", [83.0, 132.9, 83.5, 92.6], None),
        row("5000", [94.2, 113.1, 70.2, 68.8], None),
        row("10000", [118.2, 131.1, 59.4, 35.8], None),
    ],
};

const TABLE_10: PaperTable = PaperTable {
    number: 10,
    caption: "Total server time (in seconds) vs. number of clients. The connection limit was 10000 and the retry delay was 2 seconds.",
    parameter: "Number of Clients",
    unit: Unit::Seconds,
    rows: &[
        row("2000", [24.2, 132.2, 82.9, 87.3], None),
        row("5000", [24.7, 113.7, 67.8, 63.5], None),
        row("10000", [23.1, 92.6, 58.7, 34.9], None),
    ],
};

const TABLE_11: PaperTable = PaperTable {
    number: 11,
    caption: "Total server time (in seconds) vs. number of rows per synchronization.",
    parameter: "Rows",
    unit: Unit::Seconds,
    rows: &[
        row("100", [70.7, 360.5, 458.7, 321.8], None),
        row("200", [41.9, 242.2, 259.5, 198.9], None),
        row("500", [31.4, 174.5, 142.4, 128.9], None),
        row("1000", [26.1, 150.8, 101.9, 103.1], None),
        row("2000", [23.0, 135.3, 82.8, 88.2], None),
        row("5000", [17.7, 113.9, 69.2, 66.9], None),
        row("10000", [13.6, 88.4, 58.3, 36.4], None),
    ],
};

const TABLE_12: PaperTable = PaperTable {
    number: 12,
    caption: "Total server times with TCP/IP and HTTP, with and without zlib compression.",
    parameter: "Protocol",
    unit: Unit::Seconds,
    rows: &[
        row("TCPIP", [26.1, 150.8, 100.4, 103.2], None),
        row("TCPIP + zlib", [34.3, 156.9, 108.3, 106.2], None),
        row("HTTP", [30.5, 152.9, 108.3, 108.6], None),
        row("HTTP + zlib", [36.9, 167.2, 112.1, 110.7], None),
    ],
};

const TABLE_13: PaperTable = PaperTable {
    number: 13,
    caption: "Total server times with TCP/IP with different encryption options and no compression.",
    parameter: "Protocol",
    unit: Unit::Seconds,
    rows: &[
        row("TCPIP", [26.1, 150.8, 100.4, 103.2], None),
        row("TLS:ECC", [36.2, 152.6, 110.4, 109.9], None),
        row("TLS:RSA", [56.4, 159.9, 117.4, 131.0], None),
        row("TLS:FIPS", [103.9, 211.1, 161.7, 179.1], None),
    ],
};

const TABLE_14: PaperTable = PaperTable {
    number: 14,
    caption:
        "Total server times with TCP/IP with different encryption options and zlib compression.",
    parameter: "Protocol",
    unit: Unit::Seconds,
    rows: &[
        row("TCPIP + zlib", [34.3, 156.9, 108.3, 106.2], None),
        row("TLS:ECC + zlib", [36.7, 146.9, 103.6, 107.0], None),
        row("TLS:RSA + zlib", [56.8, 142.2, 104.2, 112.8], None),
        row("TLS:FIPS + zlib", [90.3, 143.6, 128.3, 147.0], None),
    ],
};

const TABLE_15: PaperTable = PaperTable {
    number: 15,
    caption: "Total server times with HTTP with different encryption options and no compression.",
    parameter: "Protocol",
    unit: Unit::Seconds,
    rows: &[
        row("HTTP", [30.5, 152.9, 108.3, 108.6], None),
        row("HTTPS:ECC", [38.4, 160.2, 112.2, 116.0], None),
        row("HTTPS:RSA", [60.1, 180.8, 121.4, 133.4], None),
        row("HTTPS:FIPS", [107.3, 213.9, 164.1, 179.4], None),
    ],
};

const TABLE_16: PaperTable = PaperTable {
    number: 16,
    caption: "Total server times with HTTP with different encryption options and zlib compression.",
    parameter: "Protocol",
    unit: Unit::Seconds,
    rows: &[
        row("HTTP + zlib", [36.9, 167.2, 112.1, 110.7], None),
        row("HTTPS:ECC + zlib", [38.5, 148.4, 104.2, 106.9], None),
        row("HTTPS:RSA + zlib", [60.0, 169.3, 110.5, 116.9], None),
        row("HTTPS:FIPS + zlib", [93.2, 159.6, 128.8, 150.4], None),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_two_to_sixteen_each_belong_to_one_test() {
        let numbers: Vec<u8> = all_tables().map(|table| table.number).collect();
        assert_eq!(numbers, (2..=16).collect::<Vec<u8>>());
        assert_eq!(
            published_for(1)
                .iter()
                .map(|t| t.number)
                .collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(
            published_for(2)
                .iter()
                .map(|t| t.number)
                .collect::<Vec<_>>(),
            [5, 6, 7, 8]
        );
        assert_eq!(
            published_for(3)
                .iter()
                .map(|t| t.number)
                .collect::<Vec<_>>(),
            [9, 10]
        );
        assert_eq!(
            published_for(4)
                .iter()
                .map(|t| t.number)
                .collect::<Vec<_>>(),
            [11]
        );
        assert_eq!(
            published_for(5)
                .iter()
                .map(|t| t.number)
                .collect::<Vec<_>>(),
            [12, 13, 14, 15, 16]
        );
        assert!(published_for(0).is_empty());
        assert!(published_for(6).is_empty());
    }

    #[test]
    fn known_cells_match_the_paper() {
        let table_2 = &published_for(1)[0];
        let row_75 = table_2.row("75").expect("Table 2 has a row for 75 workers");
        assert_eq!(row_75.values, [26.3, 148.9, 102.7, 102.6]);
        assert_eq!(row_75.sum, Some(380.5));

        let table_5 = &published_for(2)[0];
        assert_eq!(table_5.number, 5);
        assert_eq!(table_5.row("5").and_then(|row| row.sum), Some(344.6));

        let table_6 = &published_for(2)[1];
        assert_eq!(table_6.unit, Unit::Retries);
        assert_eq!(
            table_6.row("0").map(|row| row.values),
            Some([714616.0, 364457.0, 291695.0, 81744.0])
        );

        let table_4 = &published_for(1)[2];
        assert_eq!(table_4.unit, Unit::Percent);
        assert_eq!(
            table_4.row("Auto 25-100").map(|row| row.values),
            Some([2.0, 5.7, 15.6, 0.9])
        );

        let table_11 = &published_for(4)[0];
        assert_eq!(
            table_11.row("10000").map(|row| row.values),
            Some([13.6, 88.4, 58.3, 36.4])
        );

        let table_16 = &published_for(5)[4];
        assert_eq!(
            table_16.row("HTTPS:FIPS + zlib").map(|row| row.values),
            Some([93.2, 159.6, 128.8, 150.4])
        );
    }

    #[test]
    fn published_sums_agree_with_their_rows_within_rounding() {
        // The paper summed unrounded times: four cells each rounded by up to 0.05.
        let mut sums_checked = 0;
        for table in all_tables() {
            assert!(!table.rows.is_empty(), "Table {} has rows", table.number);
            for row in table.rows {
                if let Some(sum) = row.sum {
                    let cells: f64 = row.values.iter().sum();
                    assert!(
                        (cells - sum).abs() <= 0.2 + 1e-9,
                        "Table {} row {}: cells sum to {cells}, published {sum}",
                        table.number,
                        row.label
                    );
                    sums_checked += 1;
                }
            }
        }
        // Tables 2, 5 and 7 print a Sum column: 10 + 8 + 10 rows.
        assert_eq!(sums_checked, 28);
    }
}

//! Foreign keys between synchronized tables: the order an upload's tables are applied in
//! (`driver::upload`: inserts and updates parents first, deletes children first, as
//! MobiLink does) and the cycles `init` refuses where the database cannot defer them.

use rowsync_protocol::parent_first;

use crate::DbError;

/// A foreign key of a table, as the consolidated database declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    /// The constraint's name (SQLite names none: its columns and the table they
    /// reference).
    pub constraint: String,
    /// The table it references.
    pub referenced: String,
    /// Its check can wait for the commit ([`crate::dialect::Dialect::defer_foreign_keys`]).
    pub deferrable: bool,
}

/// The order one upload's tables are applied in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadOrder {
    /// Indices of the tables, parents first: inserts and updates go in this order,
    /// deletes in the reverse.
    pub parent_first: Vec<usize>,
    /// A table of the upload references another one of it: their rows must be applied
    /// in one transaction in this order (so not over apply streams).
    pub linked: bool,
    /// The foreign keys between tables of the upload that reference each other in a
    /// cycle: no order satisfies them, so they are deferred to the commit where the
    /// database can. Empty without a cycle.
    pub cycle_keys: Vec<ForeignKey>,
}

impl UploadOrder {
    /// The order of tables whose foreign keys are not read (a single table, or an
    /// upload applied before, which writes nothing): as they came.
    pub fn as_given(count: usize) -> UploadOrder {
        UploadOrder {
            parent_first: (0..count).collect(),
            linked: false,
            cycle_keys: Vec::new(),
        }
    }

    /// The order of `tables`, each its name and its foreign keys.
    pub fn of(tables: &[(&str, Vec<ForeignKey>)]) -> UploadOrder {
        let references: Vec<(&str, Vec<&str>)> = tables
            .iter()
            .map(|(name, keys)| {
                (
                    *name,
                    keys.iter().map(|key| key.referenced.as_str()).collect(),
                )
            })
            .collect();
        let order = parent_first(&references);
        let linked = tables.iter().any(|(name, keys)| {
            keys.iter().any(|key| {
                key.referenced != *name && tables.iter().any(|(other, _)| *other == key.referenced)
            })
        });
        let cycle_keys = order
            .cycles
            .iter()
            .flat_map(|cycle| keys_within(tables, cycle))
            .map(|(_, key)| key.clone())
            .collect();
        UploadOrder {
            parent_first: order.parent_first,
            linked,
            cycle_keys,
        }
    }
}

/// The keys of `tables` (each a name and its foreign keys) from one member of `cycle`
/// (indices into `tables`) to another, each with the name of the table declaring it.
fn keys_within<'t, S: AsRef<str>>(
    tables: &'t [(S, Vec<ForeignKey>)],
    cycle: &'t [usize],
) -> impl Iterator<Item = (&'t str, &'t ForeignKey)> + 't {
    let member = move |name: &str| cycle.iter().any(|&i| tables[i].0.as_ref() == name);
    cycle.iter().flat_map(move |&i| {
        let table = tables[i].0.as_ref();
        tables[i]
            .1
            .iter()
            .filter(move |key| key.referenced != table && member(&key.referenced))
            .map(move |key| (table, key))
    })
}

/// A foreign key of a cycle that cannot be deferred, with the table that declares it.
#[derive(Debug, Clone, Copy)]
pub struct Undeferrable<'a> {
    pub table: &'a str,
    pub key: &'a ForeignKey,
}

/// `init`'s check of the synchronized `tables` (each its name and foreign keys) once
/// `table` is among them: a cycle of foreign keys through `table` whose constraints
/// are not all deferrable is refused, naming its tables and constraints and ending with
/// `fix` (what to do about the undeferrable ones, in the database's own SQL).
pub fn refuse_undeferrable_cycles(
    table: &str,
    tables: &[(String, Vec<ForeignKey>)],
    fix: impl Fn(&[Undeferrable<'_>]) -> String,
) -> Result<(), DbError> {
    let references: Vec<(&str, Vec<&str>)> = tables
        .iter()
        .map(|(name, keys)| {
            let referenced = keys.iter().map(|key| key.referenced.as_str()).collect();
            (name.as_str(), referenced)
        })
        .collect();
    for cycle in parent_first(&references).cycles {
        let members: Vec<&str> = cycle.iter().map(|&i| tables[i].0.as_str()).collect();
        if !members.contains(&table) {
            continue;
        }
        let within: Vec<Undeferrable<'_>> = keys_within(tables, &cycle)
            .map(|(table, key)| Undeferrable { table, key })
            .collect();
        let undeferrable: Vec<Undeferrable<'_>> = within
            .iter()
            .copied()
            .filter(|found| !found.key.deferrable)
            .collect();
        if undeferrable.is_empty() {
            continue;
        }
        let describe = |found: &[Undeferrable<'_>]| {
            let names: Vec<String> = found
                .iter()
                .map(|f| format!("{:?} of {:?}", f.key.constraint, f.table))
                .collect();
            names.join(", ")
        };
        return Err(DbError::Invalid(format!(
            "tables {members:?} reference each other in a cycle of foreign keys ({}), so no \
             order of an upload's tables satisfies them; not deferrable: {}. {}",
            describe(&within),
            describe(&undeferrable),
            fix(&undeferrable)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(constraint: &str, referenced: &str, deferrable: bool) -> ForeignKey {
        ForeignKey {
            constraint: constraint.into(),
            referenced: referenced.into(),
            deferrable,
        }
    }

    #[test]
    fn an_upload_is_ordered_parents_first_and_knows_when_its_tables_are_linked() {
        let tables = [
            ("payment", vec![key("payment_rental_fkey", "rental", false)]),
            (
                "rental",
                vec![key("rental_customer_fkey", "customer", false)],
            ),
        ];
        let order = UploadOrder::of(&tables);
        assert_eq!(order.parent_first, [1, 0]);
        assert!(order.linked && order.cycle_keys.is_empty());
        // A cycle's keys between its members, not its keys to other tables.
        let cycle = [
            ("staff", vec![key("staff_store_fkey", "store", true)]),
            (
                "store",
                vec![
                    key("store_manager_fkey", "staff", true),
                    key("store_address_fkey", "address", false),
                ],
            ),
        ];
        let order = UploadOrder::of(&cycle);
        assert_eq!(order.parent_first, [0, 1]);
        let names: Vec<&str> = order
            .cycle_keys
            .iter()
            .map(|k| k.constraint.as_str())
            .collect();
        assert_eq!(names, ["staff_store_fkey", "store_manager_fkey"]);
        // Keys to tables outside the upload, or to the table itself, link nothing.
        let apart = [
            ("payment", vec![key("payment_staff_fkey", "staff", false)]),
            ("staff", vec![key("staff_boss_fkey", "staff", false)]),
        ];
        let order = UploadOrder::of(&apart[..1]);
        assert!(!order.linked);
        assert!(!UploadOrder::of(&apart[1..]).linked);
    }

    #[test]
    fn a_cycle_is_refused_at_init_only_when_one_of_its_keys_cannot_be_deferred() {
        let tables = vec![
            (
                "staff".to_string(),
                vec![key("staff_store_fkey", "store", true)],
            ),
            (
                "store".to_string(),
                vec![key("store_manager_fkey", "staff", false)],
            ),
            ("zone".to_string(), vec![]),
        ];
        let fix = |found: &[Undeferrable<'_>]| format!("fix {}", found[0].key.constraint);
        let error = refuse_undeferrable_cycles("store", &tables, fix).unwrap_err();
        let message = error.to_string();
        assert!(message.contains(r#"["staff", "store"]"#), "{message}");
        assert!(
            message.contains(
                r#"not deferrable: "store_manager_fkey" of "store". fix store_manager_fkey"#
            ),
            "{message}"
        );
        // A table outside the cycle is not refused for it.
        assert!(refuse_undeferrable_cycles("zone", &tables, fix).is_ok());
        let mut deferrable = tables.clone();
        deferrable[1].1[0].deferrable = true;
        assert!(refuse_undeferrable_cycles("store", &deferrable, fix).is_ok());
    }
}

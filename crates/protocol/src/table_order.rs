//! The order an upload's tables are applied in, from their foreign keys: parents before
//! children (inserts and updates), reversed for deletes. Client and server compute it
//! the same way, so an upload leaves the client in the order the server applies it.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// The tables in the order their inserts and updates are applied, as indices into the
/// tables given to [`parent_first`]; deletes go in the reverse order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableOrder {
    /// Every table once: a table after every table it references (outside cycles), and
    /// by name among tables the foreign keys leave unordered.
    pub parent_first: Vec<usize>,
    /// Tables that reference each other in a cycle (more than one table each, members
    /// by name): no order satisfies those foreign keys unless they are deferred.
    pub cycles: Vec<Vec<usize>>,
}

/// Orders `tables` (each a name and the names of the tables its foreign keys
/// reference) parents first. References to a table not in `tables` and a table's
/// references to itself are ignored. Tables that reference each other in a cycle are
/// kept together, by name, and reported in [`TableOrder::cycles`].
pub fn parent_first<S: AsRef<str>>(tables: &[(S, Vec<S>)]) -> TableOrder {
    let index: HashMap<&str, usize> = tables
        .iter()
        .enumerate()
        .map(|(position, (name, _))| (name.as_ref(), position))
        .collect();
    let parents: Vec<BTreeSet<usize>> = tables
        .iter()
        .enumerate()
        .map(|(child, (_, references))| {
            references
                .iter()
                .filter_map(|name| index.get(name.as_ref()).copied())
                .filter(|&parent| parent != child)
                .collect()
        })
        .collect();
    let name = |table: usize| tables[table].0.as_ref();
    let mut components = strongly_connected(&parents);
    for members in &mut components {
        members.sort_by_key(|&table| name(table));
    }
    let component_of = component_index(&components, tables.len());
    // Edges between components: a component waits for each component it references.
    let mut waiting_for = vec![0usize; components.len()];
    let mut children: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); components.len()];
    for (child, table_parents) in parents.iter().enumerate() {
        for &parent in table_parents {
            let (from, to) = (component_of[parent], component_of[child]);
            if from != to && children[from].insert(to) {
                waiting_for[to] += 1;
            }
        }
    }
    // Kahn's algorithm, the ready component with the smallest first name next.
    let first_name = |component: usize| name(components[component][0]);
    let mut ready: BinaryHeap<Reverse<(&str, usize)>> = (0..components.len())
        .filter(|&component| waiting_for[component] == 0)
        .map(|component| Reverse((first_name(component), component)))
        .collect();
    let mut order = TableOrder {
        parent_first: Vec::with_capacity(tables.len()),
        cycles: Vec::new(),
    };
    while let Some(Reverse((_, component))) = ready.pop() {
        let members = &components[component];
        order.parent_first.extend(members);
        if members.len() > 1 {
            order.cycles.push(members.clone());
        }
        for &child in &children[component] {
            waiting_for[child] -= 1;
            if waiting_for[child] == 0 {
                ready.push(Reverse((first_name(child), child)));
            }
        }
    }
    order
}

fn component_index(components: &[Vec<usize>], tables: usize) -> Vec<usize> {
    let mut component_of = vec![0; tables];
    for (component, members) in components.iter().enumerate() {
        for &table in members {
            component_of[table] = component;
        }
    }
    component_of
}

/// The strongly connected components of the graph whose edges go from each node to
/// `edges[node]` (Tarjan's algorithm without recursion, so no schema can overflow the
/// stack).
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let count = edges.len();
    let mut seen_at = vec![UNSEEN; count];
    let mut low = vec![0; count];
    let mut on_stack = vec![false; count];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    for root in 0..count {
        if seen_at[root] != UNSEEN {
            continue;
        }
        // Each frame: a node and its edges not yet followed.
        let mut frames = vec![(root, edges[root].iter())];
        seen_at[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some((node, followed)) = frames.last_mut() {
            let node = *node;
            if let Some(&target) = followed.next() {
                if seen_at[target] == UNSEEN {
                    seen_at[target] = next;
                    low[target] = next;
                    next += 1;
                    stack.push(target);
                    on_stack[target] = true;
                    frames.push((target, edges[target].iter()));
                } else if on_stack[target] {
                    low[node] = low[node].min(seen_at[target]);
                }
                continue;
            }
            frames.pop();
            if let Some((caller, _)) = frames.last() {
                low[*caller] = low[*caller].min(low[node]);
            }
            if low[node] == seen_at[node] {
                let mut members = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    members.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(members);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tables: &[(&str, Vec<&str>)], order: &[usize]) -> Vec<String> {
        order.iter().map(|&i| tables[i].0.to_string()).collect()
    }

    fn ordered(tables: &[(&str, Vec<&str>)]) -> Vec<String> {
        names(tables, &parent_first(tables).parent_first)
    }

    #[test]
    fn a_parent_whose_name_sorts_later_comes_first() {
        let tables = [("payment", vec!["rental"]), ("rental", vec![])];
        assert_eq!(ordered(&tables), ["rental", "payment"]);
        assert!(parent_first(&tables).cycles.is_empty());
    }

    #[test]
    fn unrelated_tables_go_by_name_whatever_order_they_come_in() {
        let tables = [("c", vec![]), ("a", vec![]), ("b", vec![])];
        assert_eq!(ordered(&tables), ["a", "b", "c"]);
    }

    #[test]
    fn chains_and_diamonds_put_every_parent_before_its_children() {
        // payment -> rental -> inventory -> film, payment -> customer -> address.
        let tables = [
            ("address", vec![]),
            ("customer", vec!["address"]),
            ("film", vec![]),
            ("inventory", vec!["film"]),
            ("payment", vec!["rental", "customer"]),
            ("rental", vec!["inventory", "customer"]),
        ];
        assert_eq!(
            ordered(&tables),
            [
                "address",
                "customer",
                "film",
                "inventory",
                "rental",
                "payment"
            ]
        );
        // A diamond: d references b and c, both reference a.
        let diamond = [
            ("d", vec!["b", "c"]),
            ("c", vec!["a"]),
            ("b", vec!["a"]),
            ("a", vec![]),
        ];
        assert_eq!(ordered(&diamond), ["a", "b", "c", "d"]);
    }

    #[test]
    fn self_references_and_tables_outside_the_upload_are_ignored() {
        let tables = [
            ("staff", vec!["staff", "store"]),
            ("category", vec!["category"]),
        ];
        let order = parent_first(&tables);
        assert_eq!(names(&tables, &order.parent_first), ["category", "staff"]);
        assert!(order.cycles.is_empty());
    }

    #[test]
    fn a_cycle_is_reported_and_kept_together_by_name_after_its_parents() {
        // store <-> staff (a manager and a home store), both reference address;
        // payment references staff.
        let tables = [
            ("payment", vec!["staff"]),
            ("store", vec!["staff", "address"]),
            ("staff", vec!["store", "address"]),
            ("address", vec![]),
            ("zone", vec![]),
        ];
        let order = parent_first(&tables);
        assert_eq!(
            names(&tables, &order.parent_first),
            ["address", "staff", "store", "payment", "zone"]
        );
        assert_eq!(order.cycles.len(), 1);
        assert_eq!(names(&tables, &order.cycles[0]), ["staff", "store"]);
    }

    #[test]
    fn every_table_appears_once_in_a_long_chain_and_in_nested_cycles() {
        let names_owned: Vec<String> = (0..5000).map(|i| format!("t{i:05}")).collect();
        // Each table references the one after it: the last is the first parent.
        let chain: Vec<(&str, Vec<&str>)> = (0..names_owned.len())
            .map(|i| {
                let parent = names_owned.get(i + 1).map(String::as_str);
                (names_owned[i].as_str(), parent.into_iter().collect())
            })
            .collect();
        let order = parent_first(&chain).parent_first;
        assert_eq!(order, (0..chain.len()).rev().collect::<Vec<_>>());
        // a -> b -> c -> a and c -> d -> c: one cycle of four.
        let nested = [
            ("a", vec!["b"]),
            ("b", vec!["c"]),
            ("c", vec!["a", "d"]),
            ("d", vec!["c"]),
            ("e", vec!["a"]),
        ];
        let order = parent_first(&nested);
        assert_eq!(
            names(&nested, &order.parent_first),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(names(&nested, &order.cycles[0]), ["a", "b", "c", "d"]);
    }
}

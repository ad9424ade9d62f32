// Package rows is the tables of rows: every node keeps a replica of each
// table whose key it holds, merges the changes of the table's log (a
// stream queue on the broker) field by field, and serves the rows API.
//
// The replica is a bbolt file (store.go). A row's cells are stored under
// one key, the row's, all its fields in one value (rowvalue.go), not one
// key a field as before: a node joining a table of 100,000 rows spent half
// of its merging in bbolt's puts, one a field (a descent of the B+tree, a
// key copied, an element inserted each), and half as many puts halve
// that. Stores of the layout before are moved to this one when opened.
package rows

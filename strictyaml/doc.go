// Package strictyaml is physd's one strict YAML reader, shared by the
// manifest, the policy, the gate config and the driver configs (simulator,
// Modbus bindings).
//
// ParseDocument / Document read a file with hostile-input limits (size,
// alias bombs, depth), expand anchors and merge keys, report duplicate keys
// and keep positions. Decode decodes a node into typed structs: unknown keys
// are errors with a "did you mean" taken from the struct's own yaml keys,
// and every error is an Error with file:line:col, the dotted field and the
// fix. Problems collects the checks made after decoding, positioned at the
// text they are about (Add/AddKey by a path of keys below a node, AddAt and
// Addf at a node), and offers the same scalar checks (Text, Int, Float …)
// for code that walks nodes by hand.
package strictyaml

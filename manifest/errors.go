package manifest

import "github.com/physd/physd/strictyaml"

// Error is one problem found in a manifest (or in a node handed to
// DecodeNode), with the position of the offending text and a hint saying how
// to fix it: strictyaml.Error.
type Error = strictyaml.Error

// Errors is every problem found, sorted by position: strictyaml.Errors.
type Errors = strictyaml.Errors

// closest returns the option nearest to s when it is an obvious typo, or ""
// (strictyaml.Closest).
func closest(s string, options []string) string { return strictyaml.Closest(s, options) }

// oneOf is the fix for a value outside an enum (strictyaml.OneOf).
func oneOf(got string, options []string) string { return strictyaml.OneOf(got, options) }

// OneOf is the fix for a value outside a set of options, with a "did you
// mean" first when the value looks like a typo of one (for checks made
// outside this package, such as the bus type against the driver registry).
func OneOf(got string, options []string) string { return strictyaml.OneOf(got, options) }

// quoteShort quotes s for a message, cutting it when it is long.
func quoteShort(s string) string { return strictyaml.Quote(s) }

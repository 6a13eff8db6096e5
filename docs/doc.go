// Package docs holds physd's documentation (the Markdown files beside this
// one). It has no code; its tests (docs_test.go) fail when the docs drift
// from the code: links and anchors, command flags, metric names, manifest
// keys.
package docs

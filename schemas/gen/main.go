// Command gen writes the JSON Schemas of this directory's parent package
// from the parsers' models; run it with go generate ./schemas.
package main

import (
	"fmt"
	"os"

	"github.com/physd/physd/schemas"
)

func main() {
	for file, build := range map[string]func() ([]byte, error){schemas.ManifestFile: schemas.Manifest, schemas.PolicyFile: schemas.Policy} {
		b, err := build()
		if err == nil {
			err = os.WriteFile(file, b, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "schemas/gen:", file+":", err)
			os.Exit(1)
		}
	}
}

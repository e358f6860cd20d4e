// tlogcheck: checks a ledgerweb transparency log with Go's own C2SP implementations,
// golang.org/x/mod/sumdb/note (signed notes, Ed25519 keys) and golang.org/x/mod/sumdb/tlog
// (the RFC 6962 tree, tiles, proofs), the packages behind Go's checksum database.
//
// It reads one JSON request on stdin and exits 0 when every check holds:
//   - the checkpoint note opens with the verifier key (note.Open);
//   - the private key file parses as a note signer and signs the same text to the same signature;
//   - every hash tile the tree needs is fetched from <base>/log/tile/... and verified against the
//     checkpoint's root by tlog.TileHashReader, and tlog.TreeHash over them is that root;
//   - each receipt's leaf is tlog.RecordHash of its JSON, and its proof passes tlog.CheckRecord
//     and equals tlog.ProveRecord over the tiles;
//   - each consistency proof passes tlog.CheckTree and equals tlog.ProveTree over the tiles.
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type receipt struct {
	Index    int64    `json:"index"`
	LeafJSON string   `json:"leaf_json"`
	Proof    []string `json:"proof"`
}

type consistency struct {
	Old     int64    `json:"old"`
	OldRoot string   `json:"old_root"`
	Proof   []string `json:"proof"`
}

type request struct {
	Verifier    string        `json:"verifier"`
	PrivateKey  string        `json:"private_key"`
	Note        string        `json:"note"`
	Base        string        `json:"base"`
	Receipts    []receipt     `json:"receipts"`
	Consistency []consistency `json:"consistency"`
}

type tiles struct{ base string }

func (t tiles) Height() int { return 8 }

func (t tiles) ReadTiles(want []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(want))
	for i, tile := range want {
		// Go's paths carry the height (tile/8/L/N); C2SP tlog-tiles paths do not (tile/L/N).
		path := strings.TrimPrefix(tile.Path(), "tile/8/")
		resp, err := http.Get(t.base + "/log/tile/" + path)
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != 200 {
			return nil, fmt.Errorf("GET %s: %d", path, resp.StatusCode)
		}
		out[i] = data
	}
	return out, nil
}

func (t tiles) SaveTiles([]tlog.Tile, [][]byte) {}

func hashes(values []string) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(values))
	for i, v := range values {
		raw, err := base64.StdEncoding.DecodeString(v)
		if err != nil || len(raw) != tlog.HashSize {
			return nil, fmt.Errorf("bad hash %q", v)
		}
		copy(out[i][:], raw)
	}
	return out, nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fail("request: %v", err)
	}
	verifier, err := note.NewVerifier(req.Verifier)
	if err != nil {
		fail("verifier key: %v", err)
	}
	opened, err := note.Open([]byte(req.Note), note.VerifierList(verifier))
	if err != nil {
		fail("note.Open: %v", err)
	}
	if req.PrivateKey != "" {
		signer, err := note.NewSigner(req.PrivateKey)
		if err != nil {
			fail("note.NewSigner: %v", err)
		}
		again, err := note.Sign(&note.Note{Text: opened.Text}, signer)
		if err != nil {
			fail("note.Sign: %v", err)
		}
		if !strings.Contains(req.Note, strings.SplitN(string(again), "\n\n", 2)[1]) {
			fail("Go signs the checkpoint text to another signature")
		}
	}
	lines := strings.Split(opened.Text, "\n")
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("size line: %v", err)
	}
	root, err := tlog.ParseHash(lines[2])
	if err != nil {
		fail("root line: %v", err)
	}
	tree := tlog.Tree{N: size, Hash: root}
	reader := tlog.TileHashReader(tree, tiles{req.Base})
	got, err := tlog.TreeHash(size, reader)
	if err != nil {
		fail("tlog.TreeHash over the served tiles: %v", err)
	}
	if got != root {
		fail("the tiles' tree hash %v is not the checkpoint's root %v", got, root)
	}
	for _, r := range req.Receipts {
		proof, err := hashes(r.Proof)
		if err != nil {
			fail("%v", err)
		}
		leaf := tlog.RecordHash([]byte(r.LeafJSON))
		if err := tlog.CheckRecord(proof, size, root, r.Index, leaf); err != nil {
			fail("tlog.CheckRecord leaf %d: %v", r.Index, err)
		}
		mine, err := tlog.ProveRecord(size, r.Index, reader)
		if err != nil {
			fail("tlog.ProveRecord leaf %d: %v", r.Index, err)
		}
		if fmt.Sprint(mine) != fmt.Sprint(tlog.RecordProof(proof)) {
			fail("leaf %d: Go's proof differs from the server's", r.Index)
		}
	}
	for _, c := range req.Consistency {
		proof, err := hashes(c.Proof)
		if err != nil {
			fail("%v", err)
		}
		old, err := tlog.ParseHash(c.OldRoot)
		if err != nil {
			fail("old root: %v", err)
		}
		if err := tlog.CheckTree(proof, size, root, c.Old, old); err != nil {
			fail("tlog.CheckTree %d -> %d: %v", c.Old, size, err)
		}
		mine, err := tlog.ProveTree(size, c.Old, reader)
		if err != nil {
			fail("tlog.ProveTree: %v", err)
		}
		if fmt.Sprint(mine) != fmt.Sprint(tlog.TreeProof(proof)) {
			fail("%d -> %d: Go's consistency proof differs from the server's", c.Old, size)
		}
	}
	fmt.Printf("OK: note, key, %d-leaf tree from tiles, %d inclusion and %d consistency proofs\n",
		size, len(req.Receipts), len(req.Consistency))
}

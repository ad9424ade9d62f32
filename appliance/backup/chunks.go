package backup

import (
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
)

// ChunkSize is how much of a file one sealed chunk holds: a file is never
// in memory whole, however large.
const ChunkSize = 1 << 20

// chunkOverhead is what sealing adds to a chunk: its nonce and GCM's tag.
const chunkOverhead = 12 + 16

// chunks is how many chunks a file of size bytes is sealed in (an empty
// file is one empty chunk, so that cutting a file off is always seen).
func chunks(size int64) int64 {
	if size == 0 {
		return 1
	}
	return (size + ChunkSize - 1) / ChunkSize
}

// sealedSize is the size of the sealed entry of a file of size bytes.
func sealedSize(size int64) int64 { return size + chunks(size)*chunkOverhead }

// chunkAD is the associated data of chunk i of file path in archive id:
// a chunk opens only in its place, and the last only as the last.
func chunkAD(id, path string, i int64, last bool) []byte {
	ad := make([]byte, 0, 32+len(id)+len(path)+9)
	ad = append(ad, "meshbox-backup chunk v1\x00"...)
	ad = append(ad, id...)
	ad = append(ad, 0)
	ad = append(ad, path...)
	ad = append(ad, 0)
	ad = binary.BigEndian.AppendUint64(ad, uint64(i))
	if last {
		ad = append(ad, 1)
	} else {
		ad = append(ad, 0)
	}
	return ad
}

// sealChunk appends chunk i of path, sealed, to dst.
func sealChunk(gcm cipher.AEAD, dst []byte, id, path string, i int64, last bool, plain []byte) []byte {
	nonce := make([]byte, gcm.NonceSize())
	_, _ = rand.Read(nonce)
	dst = append(dst, nonce...)
	return gcm.Seal(dst, nonce, plain, chunkAD(id, path, i, last))
}

// openChunk opens a sealed chunk (its nonce, then its ciphertext).
func openChunk(gcm cipher.AEAD, dst []byte, id, path string, i int64, last bool, sealed []byte) ([]byte, error) {
	n := gcm.NonceSize()
	return gcm.Open(dst, sealed[:n], sealed[n:], chunkAD(id, path, i, last))
}

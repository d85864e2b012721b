package sink

import (
	"bytes"
	"sync"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lz4Compressor compresses record batches with lz4 in 64 KiB blocks without
// a content checksum, as the Java client writes them. franz-go's own lz4 writer keeps the
// library's default 4 MiB blocks, two buffers of which stay pooled per
// concurrent compression: 8 MiB of a heap that is otherwise about 20 MiB
// while walrelay catches up.
type lz4Compressor struct{ pool sync.Pool }

func newLz4Compressor() *lz4Compressor {
	c := &lz4Compressor{}
	c.pool.New = func() any {
		w := lz4.NewWriter(nil)
		// Constant, valid options. No content checksum, as the Java client
		// writes none: the batch has its own CRC.
		_ = w.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.CompressionLevelOption(lz4.Fast), lz4.ChecksumOption(false))
		return w
	}
	return c
}

// Compress implements kgo.Compressor. A nil result tells the client to send
// the batch uncompressed.
func (c *lz4Compressor) Compress(dst *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	w := c.pool.Get().(*lz4.Writer)
	defer c.pool.Put(w)
	w.Reset(dst)
	if _, err := w.Write(src); err != nil {
		return nil, kgo.CodecError
	}
	if err := w.Close(); err != nil {
		return nil, kgo.CodecError
	}
	return dst.Bytes(), kgo.CodecLz4
}

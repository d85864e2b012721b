package replication

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/event"
)

// walHistory identifies the WAL of the server behind conn, a replication
// connection: IDENTIFY_SYSTEM, and from timeline 2 on TIMELINE_HISTORY,
// which says where each earlier timeline ended.
func walHistory(ctx context.Context, conn *pgconn.PgConn, sys pglogrepl.IdentifySystemResult) (event.WALHistory, error) {
	h := event.WALHistory{SystemID: sys.SystemID, Timeline: sys.Timeline, Flushed: sys.XLogPos}
	if sys.Timeline <= 1 {
		return h, nil
	}
	res, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
	if err != nil {
		return h, fmt.Errorf("read the history of timeline %d (TIMELINE_HISTORY): %w", sys.Timeline, err)
	}
	if h.Ends, err = parseTimelineHistory(res.Content); err != nil {
		return h, fmt.Errorf("timeline history file %s: %w", res.FileName, err)
	}
	return h, nil
}

// parseTimelineHistory reads a timeline history file: one line per earlier
// timeline, "<timeline>\t<LSN at which it ended>\t<reason>", and comments
// after '#'.
func parseTimelineHistory(content []byte) (map[int32]pglogrepl.LSN, error) {
	ends := map[int32]pglogrepl.LSN{}
	sc := bufio.NewScanner(bytes.NewReader(content))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d %q: want a timeline and an LSN", n, sc.Text())
		}
		tl, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || tl < 1 {
			return nil, fmt.Errorf("line %d %q: timeline %q", n, sc.Text(), f[0])
		}
		end, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %w", n, sc.Text(), err)
		}
		ends[int32(tl)] = end
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return ends, nil
}

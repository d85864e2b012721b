package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnableTLS turns TLS on with certFile and keyFile (PEM; copied into the
// server's directory, owned by the server's user) and waits until new
// connections see it. Connections may then ask for sslmode=verify-full.
func (s *Server) EnableTLS(ctx context.Context, certFile, keyFile string) error {
	if s.external {
		return errors.New("cannot reconfigure the external server of " + EnvDSN)
	}
	files := map[string]string{"server.crt": certFile, "server.key": keyFile}
	for name, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("read %s: %w", src, err)
		}
		dst := filepath.Join(s.dir, name)
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", dst, err)
		}
		if s.asUser != nil {
			if err := chownPostgres(dst); err != nil {
				return err
			}
		}
	}
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return fmt.Errorf("connect to enable TLS: %w", err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{
		"ALTER SYSTEM SET ssl_cert_file = '" + filepath.Join(s.dir, "server.crt") + "'",
		"ALTER SYSTEM SET ssl_key_file = '" + filepath.Join(s.dir, "server.key") + "'",
		"ALTER SYSTEM SET ssl = on",
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("enable TLS: %s: %w%s", sql, err, s.logTail())
		}
	}
	for {
		c, err := pgx.Connect(ctx, s.DSN)
		if err != nil {
			return fmt.Errorf("connect after enabling TLS: %w", err)
		}
		var on string
		err = c.QueryRow(ctx, "SHOW ssl").Scan(&on)
		c.Close(context.Background())
		if err == nil && on == "on" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the server did not turn TLS on: %w%s", ctx.Err(), s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WriteHBA replaces pg_hba.conf with content and reloads the server.
func (s *Server) WriteHBA(ctx context.Context, content string) error {
	if s.external {
		return errors.New("cannot reconfigure the external server of " + EnvDSN)
	}
	if err := os.WriteFile(filepath.Join(s.data, "pg_hba.conf"), []byte(content), 0o600); err != nil {
		return fmt.Errorf("write pg_hba.conf: %w", err)
	}
	if s.asUser != nil {
		if err := chownPostgres(filepath.Join(s.data, "pg_hba.conf")); err != nil {
			return err
		}
	}
	return s.pgctl(ctx, "reload")
}

package kafkatest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// JVM returns how the helpers here run Java: the java on PATH and the
// arguments that put the jars of lib on the class path and send log4j
// warnings to dir/java.log (the log4j configuration is written into dir).
func JVM(dir, lib string) (java string, args []string, err error) {
	java, err = exec.LookPath("java")
	if err != nil {
		return "", nil, errors.New("no java on PATH: Apache Kafka needs Java 17 or later")
	}
	conf := filepath.Join(dir, "log4j.properties")
	if err := os.WriteFile(conf, []byte("log4j.rootLogger=WARN, f\nlog4j.appender.f=org.apache.log4j.FileAppender\nlog4j.appender.f.File="+
		filepath.Join(dir, "java.log")+"\nlog4j.appender.f.layout=org.apache.log4j.PatternLayout\nlog4j.appender.f.layout.ConversionPattern=[%d] %p %m (%c)%n\n"), 0o644); err != nil {
		return "", nil, fmt.Errorf("write the log4j configuration: %w", err)
	}
	return java, []string{"-Dlog4j.configuration=file:" + conf, "-cp", filepath.Join(lib, "*")}, nil
}

// StartJava starts java with args, its output going to dir/stdout.log, and
// has it killed when this process dies (DieWithParent). The caller waits for
// it.
func StartJava(dir, java string, args ...string) (*exec.Cmd, error) {
	return StartJavaEnv(dir, nil, java, args...)
}

// StartJavaEnv is StartJava with env ("KEY=value" each) added to this
// process's environment.
func StartJavaEnv(dir string, env []string, java string, args ...string) (*exec.Cmd, error) {
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own copy
	cmd := exec.Command(java, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", java, err)
	}
	return cmd, nil
}

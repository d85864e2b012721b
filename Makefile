# Convenience targets; the README's commands work without make.
.PHONY: test bench demo check

test:
	go test -race -count=1 ./...

bench:
	go run ./cmd/walrelay-bench -events 200000 -runs 3 -svg docs/latency.svg

demo:
	go run ./cmd/walrelay demo --count 10

check:
	gofmt -l . && go vet ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

package format

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/walrelay/walrelay/format/registry"
)

// PostgreSQL type OIDs of the aggregate id columns whose Connect schema
// walrelay knows (pg_type.oid; fixed for the built-in types).
const (
	OIDInt8    uint32 = 20
	OIDInt2    uint32 = 21
	OIDInt4    uint32 = 23
	OIDText    uint32 = 25
	OIDBpchar  uint32 = 1042
	OIDVarchar uint32 = 1043
	OIDUUID    uint32 = 2950
)

// KeyColumn is what Debezium's EventRouter knows of the aggregate id
// column, whose own Connect schema is the record key's
// (defineRecordKeySchema): its type and nullability. The zero value is a
// text column NOT NULL (a required string), the key of a logical message.
type KeyColumn struct {
	// Type is the column's type OID; 0 is text.
	Type uint32
	// Nullable: the column is not NOT NULL.
	Nullable bool
}

// ErrKeyType is an aggregate id column of a type whose Connect schema
// walrelay does not know, in a format that writes it (avro, json,
// json_schema): walrelay refuses it at start.
var ErrKeyType = errors.New("the aggregate id column's type has no key schema here: want text, varchar, char, uuid, smallint, integer or bigint")

// Connect schemas of the aggregate id, by column type (as Debezium's
// PostgreSQL connector maps them) and nullability.
var (
	keyString      = &ConnectSchema{Type: "string", Required: true}
	keyStringOpt   = &ConnectSchema{Type: "string"}
	keyUUID        = &ConnectSchema{Type: "string", Name: "io.debezium.data.Uuid", Version: 1, Required: true}
	keyUUIDOpt     = &ConnectSchema{Type: "string", Name: "io.debezium.data.Uuid", Version: 1}
	keyInt16       = &ConnectSchema{Type: "int16", Required: true}
	keyInt16Opt    = &ConnectSchema{Type: "int16"}
	keyInt32       = &ConnectSchema{Type: "int32", Required: true}
	keyInt32Opt    = &ConnectSchema{Type: "int32"}
	keyInt64       = &ConnectSchema{Type: "int64", Required: true}
	keyInt64Opt    = &ConnectSchema{Type: "int64"}
	keySchemaTable = map[uint32][2]*ConnectSchema{
		0: {keyString, keyStringOpt}, OIDText: {keyString, keyStringOpt}, OIDVarchar: {keyString, keyStringOpt}, OIDBpchar: {keyString, keyStringOpt},
		OIDUUID: {keyUUID, keyUUIDOpt}, OIDInt2: {keyInt16, keyInt16Opt}, OIDInt4: {keyInt32, keyInt32Opt}, OIDInt8: {keyInt64, keyInt64Opt},
	}
)

// KeySchemaOf is the Connect schema of the key of an aggregate id column
// c; an error (ErrKeyType) for a type walrelay does not map.
func KeySchemaOf(c KeyColumn) (*ConnectSchema, error) {
	s, ok := keySchemaTable[c.Type]
	if !ok {
		return nil, fmt.Errorf("type oid %d: %w", c.Type, ErrKeyType)
	}
	if c.Nullable {
		return s[1], nil
	}
	return s[0], nil
}

// KeyNode is key, the text of an aggregate id of schema s, as a value of s:
// a number for an integer schema.
func KeyNode(s *ConnectSchema, key []byte) (*Node, error) {
	switch s.Type {
	case "int16", "int32", "int64":
		v, err := strconv.ParseInt(string(key), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: the aggregate id %q is no integer", registry.ErrPayload, key)
		}
		k := KindInt64
		if s.Type != "int64" {
			k = KindInt32
		}
		return &Node{Kind: k, Text: strconv.FormatInt(v, 10)}, nil
	}
	return &Node{Kind: KindString, Text: string(key)}, nil
}

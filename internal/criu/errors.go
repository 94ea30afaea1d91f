package criu

import (
	"errors"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound || errors.Is(err, os.ErrNotExist)
}

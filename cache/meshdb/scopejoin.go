package meshdb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/internal/names"
)

// This file makes a new node a member of existing scopes as it is added
// (NewNode.Scopes): the way a node replacing lost ones reads what the
// scopes sealed. The scope's members seal its keys for it, as for any
// member, or the admin does with the recovery kit (SealForNewNode).

// joinScopes makes node a member of each of scopes inside tx. A scope
// that does not exist is *NotFoundError.
func joinScopes(ctx context.Context, tx pgx.Tx, node string, scopes []string) error {
	for _, s := range scopes {
		if err := names.Scope(s); err != nil {
			return fmt.Errorf("scope %q: %w", s, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO scope_members (scope, node) VALUES ($1, $2) ON CONFLICT DO NOTHING`, s, node); err != nil {
			if isForeignKey(err) {
				return &NotFoundError{What: fmt.Sprintf("scope %q", s)}
			}
			return err
		}
	}
	return nil
}

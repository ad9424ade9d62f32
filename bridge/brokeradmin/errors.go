package brokeradmin

import "errors"

// Errors of Connect: what is wrong with the admin URL or the broker.
var (
	// ErrAdminURL means the admin URL is not an http(s) URL with a user and
	// password.
	ErrAdminURL = errors.New("broker admin URL")
	// ErrUnauthorized means the management API refused the credential.
	ErrUnauthorized = errors.New("401: wrong admin user or password")
	// ErrNotAdministrator means the credential is valid but its user lacks
	// the administrator tag.
	ErrNotAdministrator = errors.New("the broker admin user is not an administrator")
	// ErrNoManagement means nothing answers at the admin URL, or something
	// that is not RabbitMQ's management API.
	ErrNoManagement = errors.New("no RabbitMQ management API")
	// ErrNoVhost means the mesh's vhost does not exist on the broker.
	ErrNoVhost = errors.New("vhost not found")
)

"""Moving one phase's frames: headers, links (socket and mailboxes), the wait loop, loss watching."""

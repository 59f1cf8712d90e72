from mohawk_cli.main import main

raise SystemExit(main())

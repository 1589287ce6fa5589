'use strict';
// What rhea's own reconnect does when a broker closes its connection: connects to host:port (no SASL layer)
// for `ms` milliseconds and prints one JSON line per event: {"closed": {condition, description, info}} for each
// connection the broker closed with an error, {"opened": container-id} for each open it received.
// stdin: {"host", "port", "ms"}
const rhea = require('rhea');

const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const container = rhea.create_container({id: 'rhea-redirect'});
const print = (event) => process.stdout.write(JSON.stringify(event) + '\n');

container.on('connection_open', (context) => print({opened: context.connection.remote.open.container_id}));
container.on('connection_error', (context) => {
    const error = context.connection.error;
    print({closed: {condition: error.condition, description: error.description, info: error.info}});
});
container.on('disconnected', () => {});  // rhea decides whether to reconnect
const connection = container.connect({host: input.host, port: input.port, reconnect: true,
                                      initial_reconnect_delay: 100, max_reconnect_delay: 200});
setTimeout(() => { connection.close(); process.exit(0); }, input.ms);

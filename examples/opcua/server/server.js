// A small OPC UA server on node-opcua, for physd's OPC UA driver tests and
// examples/opcua. It is another implementation than the gopcua client
// physd uses, so the tests meet a server physd's authors did not write.
//
//   node server.js [--port 4840] [--pki DIR] [--secure] [--user NAME:PASSWORD] [--user-cert FILE] [--shift-namespace]
//                  [--operation-limits N] [--process VALUE] [--session-timeout MS]
//                  [--points N [--setpoints M] [--update-slices K]]
//
// Namespace urn:physd:opcua-test-server (ns=1 on this server), folder Plant:
//   ns=1;s=Temperature   Double, read-only, Good, 21.5 °C (moves ±0.1 each second)
//   ns=1;s=Setpoint      Double, writable, AnalogItem with EURange 0..100 and EngineeringUnits °C, starts at 20
//   ns=1;s=Pump          Boolean, writable, starts false
//   ns=1;s=Mode          String, writable, starts "auto"
//   ns=1;s=Level         Int16, writable, starts 3
//   ns=1;s=Gain          Float, writable, starts 1.5
//   ns=1;s=Broken        Double, read-only, status BadSensorFailure
//   ns=1;s=Drifting      Double, read-only, status UncertainLastUsableValue
//   ns=1;s=Locked        Double, read-only (a write answers BadNotWritable)
//   ns=1;s=Curve         Double[4], writable array [1, 2, 3, 4]
//   ns=1;i=1001          Double, read-only numeric-id node, 7.25
//   ns=1;s=Process       Double, writable, AnalogItem with EURange 0..200, starts at --process (default 50):
//                        tests drive it to exercise monitored items and deadbands
//   ns=1;s=Clamped       Double, writable, starts 10: a write above 50 is accepted with GoodClamped
//                        and 50 is kept (a server that applies a value of its own)
//   ns=1;s=ProcessQuality  String, writable, starts "Good": writing a status code's name
//                        (UncertainLastUsableValue, BadSensorFailure, Good) gives Process that
//                        status, its value kept
//
// Without --secure the server offers SecurityPolicy None only. With
// --secure it offers Basic256Sha256, Aes128_Sha256_RsaOaep and
// Aes256_Sha256_RsaPss, each Sign and SignAndEncrypt, its certificate in
// DIR/own/certs, and it trusts client certificates it has not seen (a
// test server: a plant server keeps a trust list).
// --user-cert FILE (PEM) makes the server take that X.509 user identity
// (and refuse other user certificates) instead of anonymous sessions.
// It prints "ready <endpoint>" on stdout once it listens and exits on SIGTERM.
//
// Folder Commissioning (for physd scan opcua; addCommissioningNodes at the end of this file):
// node kinds a scan meets on a plant server. All ns=1 with string ids s=Commissioning (the folder)
// and s=Commissioning.<path with dots> unless named:
//   Line1/Tank/Level       Double AnalogItem, EURange 0..5000, litre (UNECE LTR), read-only, 1200
//   Line1/Tank/Flow        Double AnalogItem, m³/h (UNECE MQH, a unit physd has no name for), 3.5
//   Line1/Tank/Count       Int32 AnalogItem, EURange 0.5..99.5 (no whole-number ends), 7
//   Line1/Tank/Température Double, read-only, 18.25 (a browse name with an accent)
//   Line1/Valve            UInt32 MultiStateDiscrete, EnumStrings Closed/Open/Fault, writable, 1
//   Line1/Cycle            Duration (a subtype of Double), read-only, 250
//   Line1/Started          DateTime, read-only
//   Line1/Label            LocalizedText, read-only
//   Line1/State            ServerState (an enumeration), read-only, 0
//   Line1/Any              BaseDataType holding a Double, read-only, 4.5
//   Line1/Samples          Double[32] (too many to bind element by element)
//   Line1/Log              String[] of no fixed length (ArrayDimensions [0])
//   Line1/OperatorOnly     Double, AccessLevel CurrentRead|CurrentWrite, UserAccessLevel CurrentRead
//   Line1/Hidden           Double, AccessLevel CurrentWrite only (not readable)
//   Line1/Odd              ns=1;s=Odd;Id (a ';' in the string id)
//   Line1/Reset            a Method
//   Deep/L3/L4/L5/L6/L7/Bottom  Double, 9 levels below Objects (beyond the scan's default depth)
// Folder Scale, with --points N only (the 10 000-point benchmark, bench/scale10k.sh with SITE=opcua):
//   ns=1;s=P00000 … P<N-1>   Double AnalogItems, EURange 0..100, read-only: each a sine of 40 around
//                        50 with its own phase and a period of 60 to 120 s, all updated once a second
//                        by one timer, so most move beyond a 0.5 % deadband every second
//   ns=1;s=SP0 … SP<M-1>  Double AnalogItems, EURange 0..100, writable, start at 50 (--setpoints M, default 8)
// With --points the server's limits take one session of N monitored items in one subscription and
// one Publish response of up to N notifications (node-opcua's default is 1 000 per response).
// --shift-namespace registers urn:physd:shifted before the test namespace, which is then ns=2:
// a reordered namespace table. --operation-limits N publishes and enforces MaxNodesPerRead and
// MaxNodesPerBrowse N (a larger request is answered BadTooManyOperations).
//
// Behaviours of other servers (hostile(), for physd's interop tests):
// --session-timeout MS grants at most MS as a session's timeout (a PLC revises a client's request
// down; node-opcua ends a session that sends nothing for that long).
// --keepalive-count N and --publishing-interval MS: every subscription is granted these, whatever
// the client asked. --publish-delay MS sends each Publish response MS late. --foreign-handles
// gives every data change a client handle the client never made. --drop-changes reports each
// monitored item's first value only (a server whose filter misses every change). --publish-fault NAME[:N]
// answers every Publish request after the first N with a ServiceFault NAME
// (BadTooManyPublishRequests, BadSubscriptionIdInvalid, ...).
// --write-fault NAME answers every Write request with a ServiceFault NAME (nothing written).
// --log-sizes prints "request CreateMonitoredItemsRequest N" and "request ReadRequest N" on stdout
// for every such request (N: its items or nodes), so a test can see how a client splits its calls.
"use strict";
const fs = require("fs");
const path = require("path");
const {
  OPCUAServer, OPCUACertificateManager, Variant, DataType, StatusCodes,
  SecurityPolicy, MessageSecurityMode, standardUnits, AccessLevelFlag, VariantArrayType, makeEUInformation, Subscription,
} = require("node-opcua");

function arg(name, def) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

async function main() {
  const port = parseInt(arg("--port", "4840"), 10);
  const pki = path.resolve(arg("--pki", path.join(__dirname, "pki")));
  const secure = process.argv.includes("--secure");
  const user = arg("--user", "");
  const userCert = arg("--user-cert", "");
  const processStart = parseFloat(arg("--process", "50"));

  const serverCertificateManager = new OPCUACertificateManager({
    rootFolder: pki,
    automaticallyAcceptUnknownCertificate: true,
  });
  await serverCertificateManager.initialize();

  const options = {
    port,
    resourcePath: "/physd",
    serverCertificateManager,
    certificateFile: path.join(pki, "own/certs/server_certificate.pem"),
    privateKeyFile: path.join(pki, "own/private/private_key.pem"),
    buildInfo: { productName: "physd-opcua-test-server", buildNumber: "1" },
    serverInfo: { applicationUri: "urn:physd:opcua-test-server" },
    securityPolicies: secure
      ? [SecurityPolicy.Basic256Sha256, SecurityPolicy.Aes128_Sha256_RsaOaep, SecurityPolicy.Aes256_Sha256_RsaPss]
      : [SecurityPolicy.None],
    securityModes: secure ? [MessageSecurityMode.Sign, MessageSecurityMode.SignAndEncrypt] : [MessageSecurityMode.None],
    allowAnonymous: user === "" && userCert === "",
  };
  const limits = parseInt(arg("--operation-limits", "0"), 10);
  if (limits > 0) {
    options.serverCapabilities = { operationLimits: { maxNodesPerRead: limits, maxNodesPerBrowse: limits } };
  }
  const points = parseInt(arg("--points", "0"), 10);
  if (points > 0) scaleLimits(options, points);
  if (userCert !== "") {
    const userCertificateManager = new OPCUACertificateManager({
      rootFolder: path.join(pki, "users"),
      automaticallyAcceptUnknownCertificate: false,
    });
    await userCertificateManager.initialize();
    const pem = fs.readFileSync(userCert, "utf8");
    const der = Buffer.from(pem.replace(/-----[^-]+-----/g, "").replace(/\s+/g, ""), "base64");
    await userCertificateManager.trustCertificate(der);
    options.userCertificateManager = userCertificateManager;
  }
  if (user !== "") {
    const [name, password] = user.split(":");
    options.userManager = { isValidUser: (u, p) => u === name && p === password };
  }
  const server = new OPCUAServer(options);
  await server.initialize();
  hostile(server);

  const addressSpace = server.engine.addressSpace;
  if (process.argv.includes("--shift-namespace")) addressSpace.registerNamespace("urn:physd:shifted");
  const ns = addressSpace.registerNamespace("urn:physd:opcua-test-server");
  const plant = ns.addFolder(addressSpace.rootFolder.objects, { browseName: "Plant" });

  let temperature = 21.5;
  ns.addVariable({
    componentOf: plant, browseName: "Temperature", nodeId: "s=Temperature", dataType: "Double", minimumSamplingInterval: 100,
    accessLevel: AccessLevelFlag.CurrentRead, userAccessLevel: AccessLevelFlag.CurrentRead,
    value: { get: () => new Variant({ dataType: DataType.Double, value: temperature }) },
  });
  let tick = 0;
  setInterval(() => { tick++; temperature = 21.5 + (tick % 2 ? 0.1 : -0.1); }, 1000).unref();

  const setpoint = ns.addAnalogDataItem({
    componentOf: plant, browseName: "Setpoint", nodeId: "s=Setpoint", dataType: "Double",
    engineeringUnitsRange: { low: 0, high: 100 },
    engineeringUnits: standardUnits.degree_celsius,
    accessLevel: "CurrentRead | CurrentWrite", userAccessLevel: "CurrentRead | CurrentWrite",
  });
  setpoint.setValueFromSource(new Variant({ dataType: DataType.Double, value: 20 }));

  const writable = (browseName, dataType, value, extra = {}) => {
    const v = ns.addVariable({
      componentOf: plant, browseName, nodeId: "s=" + browseName, dataType,
      accessLevel: "CurrentRead | CurrentWrite", userAccessLevel: "CurrentRead | CurrentWrite", ...extra,
    });
    v.setValueFromSource(new Variant({ dataType: DataType[dataType], value, ...(extra.valueRank === 1 ? { arrayType: VariantArrayType.Array } : {}) }));
    return v;
  };
  writable("Pump", "Boolean", false);
  writable("Mode", "String", "auto");
  writable("Level", "Int16", 3);
  writable("Gain", "Float", 1.5);
  writable("Curve", "Double", [1, 2, 3, 4], { valueRank: 1, arrayDimensions: [4] });

  const readOnly = (browseName, nodeId, value, status) => {
    const v = ns.addVariable({
      componentOf: plant, browseName, nodeId, dataType: "Double",
      accessLevel: AccessLevelFlag.CurrentRead, userAccessLevel: AccessLevelFlag.CurrentRead,
    });
    v.setValueFromSource(new Variant({ dataType: DataType.Double, value }), status || StatusCodes.Good);
    return v;
  };
  readOnly("Broken", "s=Broken", 0, StatusCodes.BadSensorFailure);
  readOnly("Drifting", "s=Drifting", 19.75, StatusCodes.UncertainLastUsableValue);
  readOnly("Locked", "s=Locked", 5);
  readOnly("Numeric", "i=1001", 7.25);
  addCommissioningNodes(addressSpace, ns);
  if (points > 0) addScaleNodes(addressSpace, ns, points, parseInt(arg("--setpoints", "8"), 10));

  const proc = ns.addAnalogDataItem({
    componentOf: plant, browseName: "Process", nodeId: "s=Process", dataType: "Double",
    engineeringUnitsRange: { low: 0, high: 200 },
    accessLevel: "CurrentRead | CurrentWrite", userAccessLevel: "CurrentRead | CurrentWrite",
  });
  proc.setValueFromSource(new Variant({ dataType: DataType.Double, value: processStart }));
  let clamped = 10;
  ns.addVariable({
    componentOf: plant, browseName: "Clamped", nodeId: "s=Clamped", dataType: "Double",
    accessLevel: "CurrentRead | CurrentWrite", userAccessLevel: "CurrentRead | CurrentWrite",
    value: {
      get: () => new Variant({ dataType: DataType.Double, value: clamped }),
      set: (variant) => {
        clamped = Math.min(variant.value, 50);
        return variant.value > 50 ? StatusCodes.GoodClamped : StatusCodes.Good;
      },
    },
  });
  let processQuality = "Good";
  ns.addVariable({
    componentOf: plant, browseName: "ProcessQuality", nodeId: "s=ProcessQuality", dataType: "String",
    accessLevel: "CurrentRead | CurrentWrite", userAccessLevel: "CurrentRead | CurrentWrite",
    value: {
      get: () => new Variant({ dataType: DataType.String, value: processQuality }),
      set: (variant) => {
        const status = StatusCodes[variant.value];
        if (!status) return StatusCodes.BadOutOfRange;
        processQuality = variant.value;
        proc.setValueFromSource(proc.readValue().value, status);
        return StatusCodes.Good;
      },
    },
  });

  await server.start();
  const endpoint = server.getEndpointUrl();
  process.stdout.write("ready " + endpoint + " ns=" + ns.index + "\n");

  const stop = async () => {
    await server.shutdown(0);
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  process.stderr.write("opcua test server: " + (err && err.stack ? err.stack : err) + "\n");
  process.exit(1);
});

// hostile applies the options that make the server behave as some plant
// servers do (see the header): it rewrites requests before node-opcua
// handles them.
function hostile(server) {
  const sessionTimeout = parseInt(arg("--session-timeout", "0"), 10);
  const keepAliveCount = parseInt(arg("--keepalive-count", "0"), 10);
  const publishingInterval = parseInt(arg("--publishing-interval", "0"), 10);
  const publishDelay = parseInt(arg("--publish-delay", "0"), 10);
  const foreignHandles = process.argv.includes("--foreign-handles");
  const dropChanges = process.argv.includes("--drop-changes");
  const [faultName, faultAfter] = arg("--publish-fault", "").split(":");
  const logSizes = process.argv.includes("--log-sizes");
  server.on("request", (request, channel) => {
    const name = request.schema.name;
    if (logSizes && name === "CreateMonitoredItemsRequest") process.stdout.write("request " + name + " " + (request.itemsToCreate || []).length + "\n");
    if (logSizes && name === "ReadRequest") process.stdout.write("request " + name + " " + (request.nodesToRead || []).length + "\n");
    if (sessionTimeout > 0 && name === "CreateSessionRequest") {
      request.requestedSessionTimeout = Math.min(request.requestedSessionTimeout || sessionTimeout, sessionTimeout);
    }
    if (name === "CreateSubscriptionRequest") {
      if (keepAliveCount > 0) request.requestedMaxKeepAliveCount = keepAliveCount;
      if (publishingInterval > 0) request.requestedPublishingInterval = publishingInterval;
    }
    if ((publishDelay > 0 || foreignHandles || dropChanges) && !channel.$hostile) {
      channel.$hostile = true;
      const send = channel.send_response.bind(channel);
      const reported = new Set();
      channel.send_response = (type, response, message, callback) => {
        if (response.schema.name !== "PublishResponse") return send(type, response, message, callback);
        for (const data of response.notificationMessage.notificationData || []) {
          if (!data.monitoredItems) continue;
          if (foreignHandles) for (const item of data.monitoredItems) item.clientHandle += 1000;
          if (dropChanges) {
            data.monitoredItems = data.monitoredItems.filter((item) => !reported.has(item.clientHandle));
            for (const item of data.monitoredItems) reported.add(item.clientHandle);
          }
        }
        setTimeout(() => send(type, response, message, callback), publishDelay);
      };
    }
  });
  const writeFault = arg("--write-fault", "");
  if (writeFault) {
    const status = StatusCodes[writeFault];
    if (!status) throw new Error("--write-fault: no status code " + writeFault);
    server._on_WriteRequest = (message, channel) => {
      channel.send_response("MSG", OPCUAServer.makeServiceFault(status, ["physd test server: --write-fault"]), message, () => {});
    };
  }
  if (faultName) {
    const status = StatusCodes[faultName];
    if (!status) throw new Error("--publish-fault: no status code " + faultName);
    const after = parseInt(faultAfter || "0", 10);
    const publish = server._on_PublishRequest.bind(server);
    let n = 0;
    server._on_PublishRequest = (message, channel) => {
      if (++n <= after) return publish(message, channel);
      channel.send_response("MSG", OPCUAServer.makeServiceFault(status, ["physd test server: --publish-fault"]), message, () => {});
    };
  }
}

// scaleLimits raises node-opcua's limits so that one session holds points
// monitored items in one subscription and a Publish response carries them
// all (see the header).
function scaleLimits(options, points) {
  const caps = options.serverCapabilities || {};
  caps.operationLimits = { maxMonitoredItemsPerCall: Math.max(points, 10000), ...(caps.operationLimits || {}) };
  Object.assign(caps, {
    maxMonitoredItems: Math.max(points * 2, 1000000),
    maxMonitoredItemsPerSubscription: Math.max(points * 2, 100000),
    maxMonitoredItemsQueueSize: Math.max(points * 2, 60000),
  });
  options.serverCapabilities = caps;
  Subscription.maxNotificationPerPublishHighLimit = Math.max(Subscription.maxNotificationPerPublishHighLimit, points + 100);
}

// addScaleNodes adds the folder Scale (see the header): n points moved by
// one timer and m writable setpoints.
function addScaleNodes(addressSpace, ns, n, m) {
  const scale = ns.addFolder(addressSpace.rootFolder.objects, { browseName: "Scale", nodeId: "s=Scale" });
  const ro = AccessLevelFlag.CurrentRead;
  const rw = "CurrentRead | CurrentWrite";
  const nodes = [];
  const phase = [];
  const period = [];
  for (let i = 0; i < n; i++) {
    const name = "P" + String(i).padStart(5, "0");
    nodes.push(ns.addAnalogDataItem({
      componentOf: scale, browseName: name, nodeId: "s=" + name, dataType: "Double",
      engineeringUnitsRange: { low: 0, high: 100 }, accessLevel: ro, userAccessLevel: ro,
    }));
    phase.push((i * 0.618034) % 1);
    period.push(60 + (i % 7) * 10);
  }
  for (let k = 0; k < m; k++) {
    ns.addAnalogDataItem({
      componentOf: scale, browseName: "SP" + k, nodeId: "s=SP" + k, dataType: "Double",
      engineeringUnitsRange: { low: 0, high: 100 }, accessLevel: rw, userAccessLevel: rw,
    }).setValueFromSource(new Variant({ dataType: DataType.Double, value: 50 }));
  }
  // Every point is set once a second: all in one turn of the event loop
  // (--update-slices 1, the default), or a slice of them every
  // 1000/K ms (--update-slices K), as a PLC's scan spreads its work; one
  // turn of 10 000 keeps the server's one thread from answering anything
  // else (a Write included) for a good part of that second.
  const slices = Math.max(1, parseInt(arg("--update-slices", "1"), 10));
  let slice = 0;
  const update = (from, to) => {
    const t = Date.now() / 1000;
    for (let i = from; i < to; i++) {
      const v = 50 + 40 * Math.sin(2 * Math.PI * (t / period[i] + phase[i]));
      nodes[i].setValueFromSource(new Variant({ dataType: DataType.Double, value: Math.round(v * 100) / 100 }));
    }
  };
  update(0, n);
  setInterval(() => {
    const size = Math.ceil(n / slices);
    update(slice * size, Math.min(n, (slice + 1) * size));
    slice = (slice + 1) % slices;
  }, 1000 / slices).unref();
}

// addCommissioningNodes adds the folder Commissioning (see the header).
function addCommissioningNodes(addressSpace, ns) {
  const top = ns.addFolder(addressSpace.rootFolder.objects, { browseName: "Commissioning", nodeId: "s=Commissioning" });
  const line = ns.addObject({ organizedBy: top, browseName: "Line1", nodeId: "s=Commissioning.Line1" });
  const tank = ns.addObject({ componentOf: line, browseName: "Tank", nodeId: "s=Commissioning.Line1.Tank" });
  const ro = AccessLevelFlag.CurrentRead;
  const rw = "CurrentRead | CurrentWrite";
  const set = (v, dataType, value, extra = {}) => {
    v.setValueFromSource(new Variant({ dataType, value, ...extra }));
    return v;
  };
  const analog = (browseName, dataType, range, units, value) => set(ns.addAnalogDataItem({
    componentOf: tank, browseName, nodeId: "s=Commissioning.Line1.Tank." + browseName, dataType,
    engineeringUnitsRange: range, engineeringUnits: units, accessLevel: ro, userAccessLevel: ro,
  }), DataType[dataType], value);
  analog("Level", "Double", { low: 0, high: 5000 }, makeEUInformation("LTR", "l", "litre"), 1200);
  analog("Flow", "Double", { low: 0, high: 40 }, standardUnits.cubic_metre_per_hour, 3.5);
  analog("Count", "Int32", { low: 0.5, high: 99.5 }, undefined, 7);
  const variable = (parent, browseName, dataType, value, extra = {}) => {
    const v = ns.addVariable({
      componentOf: parent, browseName, nodeId: "s=Commissioning." + (parent === line ? "Line1." : "Line1.Tank.") + browseName,
      dataType, accessLevel: ro, userAccessLevel: ro, ...extra,
    });
    return value === undefined ? v : set(v, value.dataType, value.value, value.extra);
  };
  variable(tank, "Température", "Double", { dataType: DataType.Double, value: 18.25 });
  ns.addMultiStateDiscrete({
    componentOf: line, browseName: "Valve", nodeId: "s=Commissioning.Line1.Valve", dataType: "UInt32",
    enumStrings: ["Closed", "Open", "Fault"], value: 1, accessLevel: rw, userAccessLevel: rw,
  });
  variable(line, "Cycle", "Duration", { dataType: DataType.Double, value: 250 });
  variable(line, "Started", "DateTime", { dataType: DataType.DateTime, value: new Date(Date.UTC(2026, 0, 1)) });
  variable(line, "Label", "LocalizedText", { dataType: DataType.LocalizedText, value: { text: "Line one" } });
  variable(line, "State", "ServerState", { dataType: DataType.Int32, value: 0 });
  variable(line, "Any", "BaseDataType", { dataType: DataType.Double, value: 4.5 });
  variable(line, "Samples", "Double", { dataType: DataType.Double, value: new Float64Array(32), extra: { arrayType: VariantArrayType.Array } },
    { valueRank: 1, arrayDimensions: [32] });
  variable(line, "Log", "String", { dataType: DataType.String, value: ["started", "running"], extra: { arrayType: VariantArrayType.Array } },
    { valueRank: 1, arrayDimensions: [0] });
  variable(line, "OperatorOnly", "Double", { dataType: DataType.Double, value: 1 }, { accessLevel: rw, userAccessLevel: ro });
  variable(line, "Hidden", "Double", undefined, { accessLevel: AccessLevelFlag.CurrentWrite, userAccessLevel: AccessLevelFlag.CurrentWrite });
  set(ns.addVariable({ componentOf: line, browseName: "Odd", nodeId: "s=Odd;Id", dataType: "Double", accessLevel: ro, userAccessLevel: ro }), DataType.Double, 2);
  const reset = ns.addMethod(line, { browseName: "Reset", nodeId: "s=Commissioning.Line1.Reset", inputArguments: [], outputArguments: [] });
  reset.bindMethod((_inputs, _context, callback) => callback(null, { statusCode: StatusCodes.Good, outputArguments: [] }));
  let parent = ns.addFolder(top, { browseName: "Deep", nodeId: "s=Commissioning.Deep" });
  for (const name of ["L3", "L4", "L5", "L6", "L7"]) {
    parent = ns.addFolder(parent, { browseName: name, nodeId: "s=Commissioning.Deep." + name });
  }
  set(ns.addVariable({ componentOf: parent, browseName: "Bottom", nodeId: "s=Commissioning.Deep.Bottom", dataType: "Double", accessLevel: ro, userAccessLevel: ro }), DataType.Double, 9);
}

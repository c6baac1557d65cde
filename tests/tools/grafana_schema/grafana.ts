// Grafana's published types shaped for dashboard JSON. The generated wrappers (wrap.py) assign every
// dashboard, row and panel of llmslo's output, as an object literal, to these types, so `tsc --strict`
// rejects a misspelt field (excess property), a value of the wrong type and a missing required option.
import type { FieldConfigSource, Panel } from "@grafana/schema";
import type { Dataquery } from "@grafana/grafana-foundation-sdk/prometheus";

// JSON has no TypeScript enums: an enum-typed field takes the enum's values, as literals.
export type Json<T> =
  T extends string ? `${T}` :
  T extends number | boolean | null | undefined ? T :
  T extends ReadonlyArray<infer U> ? Array<Json<U>> :
  T extends object ? { [K in keyof T]: Json<T[K]> } :
  T;

// A Prometheus query of a panel (the data source plugin's own query model); the SDK's marker method is
// no part of the JSON.
export type PromQuery = Json<Omit<Dataquery, "_implementsDataqueryVariant">> & { refId: string };

// A panel whose options and custom field config are those its plugin's schema declares.
export type PanelOf<Options, Custom = Record<string, unknown>> =
  Omit<Json<Panel>, "options" | "fieldConfig" | "targets"> & {
    options: Json<Options>;
    fieldConfig: Json<FieldConfigSource<Custom>>;
    targets: PromQuery[];
  };

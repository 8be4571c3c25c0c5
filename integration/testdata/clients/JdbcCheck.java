// PostgreSQL JDBC (pgjdbc) threads for pgtender's integration tests, run as a
// single-file program:
//
//   java -cp /usr/share/java/postgresql.jar JdbcCheck.java DSN PREPARE_THRESHOLD THREADS TRANSACTIONS
//
// DSN is a postgres:// URL; it becomes jdbc:postgresql://host:port/db with
// user, password and prepareThreshold (pgjdbc's default is 5: a
// PreparedStatement becomes a named server statement, S_N, on its fifth
// execution; 1 names it at once; 0 never does).
//
// Each thread has one connection with autocommit off and three
// PreparedStatements it reuses across all its transactions: a parameterized
// SELECT, an INSERT run as a batch of three rows, and a count of its own
// rows. Every fourth transaction is rolled back and must leave nothing.
//
// Every line starts with "check:", "observe:", "error:" or is the final
// summary "jdbc prepareThreshold=P: T transactions, E errors". Exits 1 if
// E > 0.

import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

public class JdbcCheck {
    static final String TABLE = "drivers_jdbc";
    static final Map<String, Integer> failures = new TreeMap<>();
    static final List<String> firstErrors = new ArrayList<>();

    static String url;
    static Properties props = new Properties();

    static class Mismatch extends Exception {
        Mismatch(String m) { super(m); }
    }

    static void expect(String what, Object got, Object want) throws Mismatch {
        if (!got.equals(want)) throw new Mismatch(what + ": got " + got + ", want " + want);
    }

    static synchronized void failed(int tid, int i, Exception e, int n) {
        String code = e instanceof SQLException ? ((SQLException) e).getSQLState() : "-";
        String key = e.getClass().getSimpleName() + " " + code;
        failures.merge(key, n, Integer::sum);
        if (firstErrors.size() < 10) {
            firstErrors.add("thread " + tid + " transaction " + i + ": " + key + ": " + e.getMessage().replace('\n', ' '));
        }
    }

    static long scalar(ResultSet rs) throws SQLException {
        try (rs) {
            rs.next();
            return rs.getLong(1);
        }
    }

    static void worker(int tid, int transactions) {
        try (Connection c = DriverManager.getConnection(url, props)) {
            c.setAutoCommit(false);
            PreparedStatement sum = c.prepareStatement("SELECT ?::int + ?::int");
            PreparedStatement insert = c.prepareStatement("INSERT INTO " + TABLE + " (thread, n) VALUES (?, ?)");
            PreparedStatement count = c.prepareStatement("SELECT count(*) FROM " + TABLE + " WHERE thread = ?");
            long committed = 0;
            for (int i = 0; i < transactions; i++) {
                try {
                    sum.setInt(1, tid);
                    sum.setInt(2, i);
                    expect("sum", scalar(sum.executeQuery()), (long) (tid + i));
                    for (int k = 0; k < 3; k++) {
                        insert.setInt(1, tid);
                        insert.setInt(2, i * 10 + k);
                        insert.addBatch();
                    }
                    int[] counts = insert.executeBatch();
                    expect("batch", counts.length, 3);
                    count.setInt(1, tid);
                    expect("own rows", scalar(count.executeQuery()), committed + 3);
                    if (i % 4 == 3) {
                        c.rollback();
                    } else {
                        c.commit();
                        committed += 3;
                    }
                    expect("own rows after transaction", scalar(count.executeQuery()), committed);
                    c.commit();
                } catch (SQLException | Mismatch e) {
                    failed(tid, i, e, 1);
                    try { c.rollback(); } catch (SQLException ignored) { }
                }
            }
        } catch (SQLException e) {
            failed(tid, -1, e, transactions);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: JdbcCheck.java DSN PREPARE_THRESHOLD THREADS TRANSACTIONS");
            System.exit(2);
        }
        URI u = new URI(args[0]);
        String[] userInfo = u.getRawUserInfo().split(":", 2);
        url = "jdbc:postgresql://" + u.getHost() + ":" + u.getPort() + u.getPath();
        props.setProperty("user", URLDecoder.decode(userInfo[0], StandardCharsets.UTF_8));
        props.setProperty("password", URLDecoder.decode(userInfo[1], StandardCharsets.UTF_8));
        props.setProperty("sslmode", "disable");
        props.setProperty("connectTimeout", "10");
        props.setProperty("socketTimeout", "60");
        String threshold = args[1];
        props.setProperty("prepareThreshold", threshold);
        int threads = Integer.parseInt(args[2]);
        int perThread = Integer.parseInt(args[3]);

        try (Connection c = DriverManager.getConnection(url, props); Statement s = c.createStatement()) {
            System.out.println("check: pgjdbc " + c.getMetaData().getDriverVersion() + ", Java " + System.getProperty("java.version"));
            s.execute("DROP TABLE IF EXISTS " + TABLE);
            s.execute("CREATE TABLE " + TABLE + " (thread int, n int)");
        }
        List<Thread> pool = new ArrayList<>();
        for (int tid = 0; tid < threads; tid++) {
            final int id = tid;
            Thread t = new Thread(() -> worker(id, perThread));
            t.start();
            pool.add(t);
        }
        for (Thread t : pool) t.join();

        int total = threads * perThread;
        int failed = failures.values().stream().mapToInt(Integer::intValue).sum();
        for (String line : firstErrors) System.out.println("error: " + line);
        if (failed > 0) {
            List<String> kinds = new ArrayList<>();
            failures.forEach((k, n) -> kinds.add(n + " " + k));
            System.out.println("error: " + failed + " of " + total + " transactions failed (" + String.join(", ", kinds) + ")");
        }
        try (Connection c = DriverManager.getConnection(url, props); Statement s = c.createStatement()) {
            System.out.println("observe: committed_rows=" + scalar(s.executeQuery("SELECT count(*) FROM " + TABLE)));
            s.execute("DROP TABLE " + TABLE);
        }
        System.out.println("check: " + threads + " threads x " + perThread
            + " transactions (reused PreparedStatements: SELECT, INSERT batch of 3, count; every fourth rolled back), prepareThreshold=" + threshold);
        System.out.println("jdbc prepareThreshold=" + threshold + ": " + total + " transactions, " + failed + " errors");
        System.exit(failed > 0 ? 1 : 0);
    }
}
